"""Markdown as the transcript draws it: block quotes with a bar, one header weight and soft grid lines
in tables, TeX math (inline and display) as rich text, headings and lists spaced as prose."""

from app.chat.markdown import markdown_html
from app.chat.math_text import math_html
from tests.app_support import ScriptedBackend, make_context, open_window, screenshot, send, wait_reply

REPLY = r"""## Euler's identity

The identity $e^{i\pi} + 1 = 0$ links five constants; with \(x_i\) and $\alpha \leq \beta$ inline.
Prices stay prices: it costs $5 or $10, and `echo $HOME $PATH` is code.

$$\sum_{i=1}^{n} i = \frac{n(n+1)}{2}$$

> A quote keeps its bar,
> over two lines.
>
> > and a nested one.

### Steps

1. Square both sides: \[ \sqrt{x^2 + 1} \]
2. Name the set $\mathbb{R}^n$
   - a nested item
   - another

| Symbol | **Meaning** | `code` |
|---|---|---|
| $\pi$ | ratio | `pi` |
| $\infty$ | unbounded | `inf` |
"""


def test_math_converter_common_constructs():
    assert math_html(r"\frac{a+b}{2}") == "<sup>a+b</sup>\u2044<sub>2</sub>"
    assert math_html(r"x^2 + y_{i,j}") == "x<sup>2</sup> + y<sub>i,j</sub>"
    assert math_html(r"\sqrt{x}").startswith("√<span")
    assert math_html(r"\alpha \leq \mathbb{R}") == "α ≤ ℝ"
    assert math_html(r"\text{if } a<b") == "if  a&lt;b"
    assert math_html(r"\begin{pmatrix} a \end{pmatrix}") == r"\begin{pmatrix} a \end{pmatrix}"
    assert math_html(r"\unknown x") == r"\unknown x"


def test_markdown_math_quotes_tables_and_spacing(qapp):
    html = markdown_html(REPLY)
    assert "e<sup>iπ</sup> + 1 = 0" in html and "x<sub>i</sub>" in html and "α ≤ β" in html
    assert "$5 or $10" in html and "echo $HOME $PATH" in html         # dollars that are not math
    assert '<p align="center"' in html and "<sup>n(n+1)</sup>" in html  # display math on its own line
    assert html.count('bgcolor="#4a5275"') == 2                        # the quote and the nested one: a bar each
    assert 'font-weight:700;">Meaning' not in html and html.count('bgcolor="#262932"') == 3
    assert "border-style:solid; border-color:#2f323b" in html
    assert 'margin-top:0px; margin-bottom:6px;"><span style=" font-size:13pt' in html   # first heading: no gap above
    assert 'margin-top:14px; margin-bottom:6px;"><span style=" font-size:11.5pt' in html
    assert "QDMATH" not in html


def test_markdown_reply_screenshot(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    pieces = [(REPLY[i:i + 60], "") for i in range(0, len(REPLY), 60)]
    window.session.set_backend(ScriptedBackend(pieces))
    window.chat.set_model("Scripted")
    window.show_page("chat")
    send(qtbot, window, "Show me some math")
    wait_reply(qtbot, window)
    window.resize(1100, 1000)
    screenshot(window, "chat_markdown_math_quotes_tables")

"""Syntax highlighting of code blocks (Pygments) as inline-styled HTML for Qt's rich text."""

from __future__ import annotations

import html

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

STYLE = "one-dark"
ALIASES = {"py": "python", "sh": "bash", "shell": "bash", "zsh": "bash", "js": "javascript", "ts": "typescript",
           "yml": "yaml", "c++": "cpp", "rs": "rust", "md": "markdown"}

_formatter = HtmlFormatter(style=STYLE, noclasses=True, nowrap=True)


def highlight_html(code: str, language: str) -> str:
    """The code as HTML spans (no <pre>); plain escaped text for unknown languages."""
    try:
        lexer = get_lexer_by_name(ALIASES.get(language, language) or "text", stripnl=False, ensurenl=False)
    except ClassNotFound:
        return html.escape(code)
    return highlight(code, lexer, _formatter)

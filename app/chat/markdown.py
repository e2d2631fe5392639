"""Markdown to the rich text a QLabel shows: Qt's own CommonMark/GitHub parser, then the theme's look:
headings and lists spaced as prose, block quotes with a bar, tables with a tinted header row of one
weight and soft grid lines, tinted inline code, and TeX math ($…$, \\(…\\) inline; $$…$$, \\[…\\] on
their own) drawn by math_text.py. Math is taken out before the parser sees it (its _ and * are not
emphasis) and put back after; inline code keeps its dollars."""

from __future__ import annotations

import re

from PySide6.QtGui import QTextDocument

from app.chat.math_text import math_html

BODY_STYLE = re.compile(r"<body style=\"[^\"]*\">")     # Qt pins a font here; the label's own font wins
INLINE_CODE = "font-family:'monospace';"
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)
DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]", re.S)
INLINE_MATH = re.compile(r"\\\((.+?)\\\)|(?<![\\$\w])\$(?=[^\s$])([^$\n]*?[^\s$\\])\$(?![\w$])")
MARK = "QDMATH{}X"
MARK_RE = re.compile(r"QDMATH(\d+)X")
MATH_STYLE = "font-family:'DejaVu Serif','Cambria Math','STIX Two Math',serif; color:#dfe3ff;"
HEADING = re.compile(r'<h(\d) style="[^"]*">(<span style=" font-size:[^;]*;)')
HEADING_SIZES = {"1": "15pt", "2": "13pt", "3": "11.5pt"}
QUOTE_PARAGRAPH = re.compile(r'<p style="[^"]*margin-left:([1-9]\d*)px; margin-right:40px;[^"]*">(.*?)</p>\n?', re.S)
TABLE = re.compile(r'<table border="1" style=" border-collapse:collapse;"[^>]*>\s*<tr>(.*?)</tr>', re.S)


def markdown_html(text: str) -> str:
    formulas: list[tuple[str, bool]] = []
    document = QTextDocument()
    document.setMarkdown(_take_math(text, formulas), QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    html = BODY_STYLE.sub("<body>", document.toHtml())
    html = html.replace(INLINE_CODE, "font-family:'DejaVu Sans Mono','Menlo','Consolas',monospace; "
                                     "background-color:#2a2c33; color:#e8c38a;")
    html = _headings(_lists(_quotes(_tables(html))))
    return _put_math(html, formulas)


def _take_math(text: str, formulas: list) -> str:
    """The text with each formula replaced by a mark the parser leaves alone (outside inline code)."""
    def keep(match, display):
        formulas.append((next(g for g in match.groups() if g is not None), display))
        mark = MARK.format(len(formulas) - 1)
        return f"\n\n{mark}\n\n" if display else mark

    pieces = []
    last = 0
    for code in CODE_SPAN.finditer(text):
        pieces.append(_math_marks(text[last:code.start()], keep))
        pieces.append(code.group(0))
        last = code.end()
    pieces.append(_math_marks(text[last:], keep))
    return "".join(pieces)


def _math_marks(prose: str, keep) -> str:
    prose = DISPLAY_MATH.sub(lambda m: keep(m, True), prose)
    return INLINE_MATH.sub(lambda m: keep(m, False), prose)


def _put_math(html: str, formulas: list) -> str:
    def display(match):
        return (f'<p align="center" style=" margin-top:8px; margin-bottom:8px;"><span style=" {MATH_STYLE} '
                f'font-size:12pt;">{math_html(formulas[int(match.group(1))][0])}</span></p>')

    html = re.sub(r'<p style="[^"]*">QDMATH(\d+)X</p>', lambda m: display(m) if formulas[int(m.group(1))][1]
                  else m.group(0), html)
    return MARK_RE.sub(lambda m: f'<span style=" {MATH_STYLE}">{math_html(formulas[int(m.group(1))][0])}</span>',
                       html)


def _headings(html: str) -> str:
    """Room above a heading (none at the very top) and below it; sizes a step above the text, not posters."""
    def restyle(match):
        top = 0 if html[:match.start()].rstrip().endswith("<body>") else 14
        size = HEADING_SIZES.get(match.group(1), "10.5pt")
        return (f'<h{match.group(1)} style=" margin-top:{top}px; margin-bottom:6px;">'
                f'<span style=" font-size:{size};')

    return HEADING.sub(restyle, html)


def _lists(html: str) -> str:
    """Items close together, the list apart from the paragraphs around it."""
    html = re.sub(r'<(ul|ol) style="margin-top: 0px; margin-bottom: 0px;', r'<\1 style="margin-top: 4px; '
                  r'margin-bottom: 4px;', html)
    return re.sub(r'<li style=" margin-top:6px; margin-bottom:6px;', '<li style=" margin-top:2px; margin-bottom:2px;',
                  html)


def _quotes(html: str) -> str:
    """Block quotes (Qt indents them on both sides) as a muted column behind a bar."""
    def bar(paragraphs: list[str], depth: int) -> str:
        inner = "".join(f'<p style=" margin-top:2px; margin-bottom:2px;">{p}</p>' for p in paragraphs)
        return (f'<table cellspacing="0" cellpadding="0" style=" margin-top:6px; margin-bottom:6px; '
                f'margin-left:{(depth - 1) * 14}px;"><tr><td width="3" bgcolor="#4a5275"></td>'
                f'<td style=" padding-left:12px; color:#aab0bf;">{inner}</td></tr></table>\n')

    out: list[str] = []
    group: list[str] = []
    last = depth = 0
    for match in QUOTE_PARAGRAPH.finditer(html):
        if group and (match.start() != last or int(match.group(1)) // 40 != depth):
            out.append(bar(group, depth))
            group = []
        if not group:
            out.append(html[last:match.start()])
        group.append(match.group(2))
        depth, last = int(match.group(1)) // 40, match.end()
    if group:
        out.append(bar(group, depth))
    out.append(html[last:])
    return "".join(out)


def _tables(html: str) -> str:
    """Soft solid grid lines; the first row is the header: tinted, every cell the same weight."""
    def restyle(match):
        header = re.sub(r"<span style=\" font-weight:700;\">(.*?)</span>", r"\1", match.group(1), flags=re.S)
        header = header.replace("<td>", '<td bgcolor="#262932" style=" font-weight:600;">')
        return ('<table border="1" style=" border-collapse:collapse; border-style:solid; border-color:#2f323b;" '
                f'cellpadding="6">\n<tr>{header}</tr>')

    return TABLE.sub(restyle, html)

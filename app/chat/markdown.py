"""Markdown to the rich text a QLabel shows: Qt's own CommonMark/GitHub parser, with the
theme's colours for tables and inline code (Qt's defaults are black borders, no code tint)."""

from __future__ import annotations

import re

from PySide6.QtGui import QTextDocument

BODY_STYLE = re.compile(r"<body style=\"[^\"]*\">")     # Qt pins a font here; the label's own font wins
TABLE = '<table border="1" style=" border-collapse:collapse;"'
INLINE_CODE = "font-family:'monospace';"


def markdown_html(text: str) -> str:
    document = QTextDocument()
    document.setMarkdown(text, QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    html = BODY_STYLE.sub("<body>", document.toHtml())
    html = html.replace(TABLE, '<table border="1" style=" border-collapse:collapse; border-color:#3a3d46;"')
    return html.replace(INLINE_CODE, "font-family:'DejaVu Sans Mono','Menlo','Consolas',monospace; "
                                     "background-color:#2a2c33; color:#e8c38a;")

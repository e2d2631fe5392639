"""Numbers as people read them: sizes, durations, token counts."""

from __future__ import annotations

import re


BREAK_EVERY = 24           # a word longer than this gets break opportunities every BREAK_EVERY characters
_LONG_WORD = re.compile(rf"[^\s<>&]{{{BREAK_EVERY + 1},}}")
_TEXT_NODE = re.compile(r">([^<]+)<")


def breakable(text: str) -> str:
    """Plain text with a zero-width space every BREAK_EVERY characters of a long unbroken word (a URL, a hash), so
    that a wrapping label breaks it instead of clipping it."""
    return _LONG_WORD.sub(lambda m: "\u200b".join(m[0][i:i + BREAK_EVERY]
                                                  for i in range(0, len(m[0]), BREAK_EVERY)), text)


def breakable_html(html: str) -> str:
    """breakable() on the body's text between tags (the head's style sheet, entities and tags untouched)."""
    start = html.find("<body")
    head, body = (html[:start], html[start:]) if start >= 0 else ("", html)
    return head + _TEXT_NODE.sub(lambda m: f">{breakable(m[1])}<", body)


def weights_words(weights: str, bits: int = 16) -> str:
    """How a plan's weights load, in words: "int4", or "16-bit" / "32-bit" for unquantized weights (MemoryPlan's
    weights and weight_bits: the CPU runs them in fp32)."""
    return "int4" if weights == "int4" else f"{bits}-bit"


def human_bytes(n: float) -> str:
    """Decimal units, as the hub and file managers show sizes."""
    for unit in ("B", "KB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def human_gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def human_memory(n: float) -> str:
    """Binary units, as memory is counted: GiB down to 1 GiB, then MiB, then KiB."""
    for shift, unit in ((30, "GiB"), (20, "MiB")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n / 1024:.0f} KiB"


def human_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def human_tokens(n: int) -> str:
    if n < 1000:
        return str(n)
    if n < 100_000:
        return f"{n / 1000:.1f}K".replace(".0K", "K")
    return f"{n // 1000}K"

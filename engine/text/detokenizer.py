"""StreamDetokenizer: token ids in, text increments out, never ending inside a character.

A byte-level BPE token can hold part of a multi-byte UTF-8 character; decoding it alone gives
"\ufffd". So each step decodes a short window (the tokens emitted last step, as context, plus
the ones not yet emitted) and returns what the new tokens add, holding them back while the
window's text ends in "\ufffd". The window holds only the last step's tokens and those of a
split character, so a step costs O(1), not a decode of the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable


class StreamDetokenizer:
    def __init__(self, decode: Callable[..., str], skip_special_tokens: bool = False):
        """decode(ids, skip_special_tokens=...) -> text: the tokenizer's decoder."""
        self.decode = decode
        self.skip_special_tokens = skip_special_tokens
        self._window: list[int] = []
        self._read = 0  # _window[:_read] is context, already emitted

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (often "", while a character is split)."""
        self._window.append(token_id)
        context = self._decode(self._window[: self._read])
        text = self._decode(self._window)
        if text.endswith("\ufffd") or len(text) <= len(context):
            return ""
        self._window = self._window[self._read:]
        self._read = len(self._window)
        return text[len(context):]

    def flush(self) -> str:
        """Return whatever is held back (a stream that ends mid-character gets its "\ufffd")."""
        context = self._decode(self._window[: self._read])
        text = self._decode(self._window)
        self._window, self._read = [], 0
        return text[len(context):]

    def _decode(self, ids: list[int]) -> str:
        return self.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

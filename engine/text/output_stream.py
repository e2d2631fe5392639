"""OutputStream: a sequence's generated tokens -> labelled pieces (engine/core/params.py: Text, Reasoning,
CallStart, CallArgs) and a kind for each token (content | reasoning | control).

Qwen3.5 checkpoints think inside <think> ... </think>. When the prompt leaves the model inside a
think block (the chat template's generation prompt ends with "<think>\\n" when thinking is on),
the output is reasoning until </think>, then content. The tags are tokens of their own and are
never shown; nor is the blank line after </think>. Stop strings apply to the content. When the
request has tools, the content goes through the tool-call parser: calls come out as CallStart /
CallArgs pieces, the text around them as Text.
"""

from __future__ import annotations

from engine.chat.tools import ToolCallParser, tool_schemas
from engine.core.params import Piece, Reasoning, SamplingParams, Text, TokenKind
from engine.text.text_stream import TextStream


def starts_in_reasoning(prompt: list[int], think_start: int | None, think_end: int | None) -> bool:
    """True when the prompt's last <think> is not closed by a later </think>."""
    if think_start is None or think_end is None:
        return False
    for t in reversed(prompt):
        if t == think_end:
            return False
        if t == think_start:
            return True
    return False


class OutputStream:
    def __init__(self, tokenizer, params: SamplingParams, in_reasoning: bool, tools: list[dict] | None = None):
        """`tools`: the request's tools (OpenAI-style); their calls are parsed out of the content. None: no parsing."""
        self.think_start = tokenizer.think_start_id
        self.think_end = tokenizer.think_end_id
        self.content_detok = tokenizer.detokenizer(skip_special_tokens=params.skip_special_tokens)
        self.content = TextStream(params.stop)
        self.thinking = tokenizer.detokenizer(skip_special_tokens=params.skip_special_tokens)
        self.calls = ToolCallParser(tool_schemas(tools)) if tools else None
        self.in_reasoning = in_reasoning
        self.reasoning_tokens = 0
        self._content_started = False   # a content token with more than line breaks came
        self._shown = False             # content text has been shown

    @property
    def stopped(self) -> bool:
        """A stop string ended the content."""
        return self.content.stopped

    @property
    def stop_sequence(self) -> str | None:
        return self.content.matched

    @property
    def made_calls(self) -> bool:
        return self.calls is not None and self.calls.calls > 0

    def push(self, token: int) -> tuple[TokenKind, list[Piece]]:
        """-> (the token's kind, the pieces it completes)."""
        if self.in_reasoning:
            if token == self.think_end:
                self.in_reasoning = False
                return "control", _reasoning(self.thinking.flush())
            self.reasoning_tokens += 1
            return "reasoning", _reasoning(self.thinking.push(token))
        if token == self.think_start and self.think_start is not None:
            self.in_reasoning = True
            return "control", []
        piece = self.content_detok.push(token)
        kind: TokenKind = "content"
        if not self._content_started and piece:
            self._content_started = piece.strip("\n") != ""
            kind = "content" if self._content_started else "control"     # the blank line after </think>
        return kind, self._content(self.content.push(piece))

    def finish(self) -> list[Piece]:
        """The end of the reply: what the detokenizers, the stop strings' hold-back and the parser still have."""
        pieces = self._content(self.content.finish(self.content_detok.flush()))
        if self.calls is not None:
            pieces += self.calls.finish()
        return pieces + (_reasoning(self.thinking.flush()) if self.in_reasoning else [])

    def _content(self, text: str) -> list[Piece]:
        if not self._shown:
            text = text.lstrip("\n")
            self._shown = bool(text)
        if not text:
            return []
        return self.calls.feed(text) if self.calls is not None else [Text(text)]


def _reasoning(text: str) -> list[Piece]:
    return [Reasoning(text)] if text else []

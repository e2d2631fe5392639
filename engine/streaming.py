"""OutputStream: a sequence's generated tokens -> content and reasoning text deltas.

Qwen3.5 checkpoints think inside <think> ... </think>. When the prompt leaves the model inside a
think block (the chat template's generation prompt ends with "<think>\\n" when thinking is on),
the output is reasoning until </think>, then content. The tags are tokens of their own and are
never shown. Stop strings apply to the content.
"""

from __future__ import annotations

from engine.params import SamplingParams
from engine.textstream import TextStream


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
    def __init__(self, tokenizer, params: SamplingParams, in_reasoning: bool):
        self.think_start = tokenizer.think_start_id
        self.think_end = tokenizer.think_end_id
        self.content = TextStream(tokenizer.detokenizer(skip_special_tokens=params.skip_special_tokens), params.stop)
        self.thinking = tokenizer.detokenizer(skip_special_tokens=params.skip_special_tokens)
        self.in_reasoning = in_reasoning
        self.reasoning_tokens = 0
        self._content_started = False

    @property
    def stopped(self) -> bool:
        return self.content.stopped

    def push(self, token: int) -> tuple[str, str]:
        """-> (content delta, reasoning delta)."""
        if self.in_reasoning:
            if token == self.think_end:
                self.in_reasoning = False
                return "", self.thinking.flush()
            self.reasoning_tokens += 1
            return "", self.thinking.push(token)
        if token == self.think_start and self.think_start is not None:
            self.in_reasoning = True
            return "", ""
        return self._content(self.content.push(token)), ""

    def finish(self) -> tuple[str, str]:
        reasoning = self.thinking.flush() if self.in_reasoning else ""
        return self._content(self.content.finish()), reasoning

    def _content(self, text: str) -> str:
        if not self._content_started:
            text = text.lstrip("\n")       # the blank line after </think>
            self._content_started = bool(text)
        return text

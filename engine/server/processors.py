"""Logits processors the server adds to requests: tool_choice and logit_bias.

The engine calls each once per sampled token with the output so far and that step's logits [V].
Processors that watch the output keep a cursor, so a step costs O(new tokens), not O(output).
"""

from __future__ import annotations

import torch


def force(logits: torch.Tensor, token: int) -> torch.Tensor:
    out = torch.full_like(logits, float("-inf"))
    out[token] = 0.0
    return out


class ReplyTracker:
    """Follows the output: which new tokens are the reply's content (after the thinking block)."""

    def __init__(self, in_reasoning: bool, think_end: int | None):
        self.thinking = in_reasoning and think_end is not None
        self.think_end = think_end
        self.seen = 0

    def new_content(self, output: list[int]) -> list[int]:
        content = []
        for token in output[self.seen:]:
            if self.thinking:
                self.thinking = token != self.think_end
            else:
                content.append(token)
        self.seen = len(output)
        return content


class ForceToolCall:
    """tool_choice "required" or a named function: once the thinking is over, the reply starts with
    `separator` (the blank line the template puts after </think>; empty when the prompt already
    closed the thinking) and then `opening` ("<tool_call>\\n", or up to "<function=NAME>\\n")."""

    def __init__(self, opening: list[int], separator: list[int], in_reasoning: bool, think_end: int | None):
        self.reply = ReplyTracker(in_reasoning, think_end)
        self.target = (separator if self.reply.thinking else []) + opening
        self.pos = 0

    def __call__(self, output: list[int], logits: torch.Tensor) -> torch.Tensor:
        for token in self.reply.new_content(output):
            if self.pos < len(self.target):  # a token that is not the target's ends the forcing
                self.pos = self.pos + 1 if token == self.target[self.pos] else len(self.target)
        if not self.reply.thinking and self.pos < len(self.target):
            return force(logits, self.target[self.pos])
        return logits


class StopAfterToolCall:
    """parallel_tool_calls false: the reply ends after its first complete call."""

    def __init__(self, call_end: int, eos: int, in_reasoning: bool, think_end: int | None):
        self.reply = ReplyTracker(in_reasoning, think_end)
        self.call_end, self.eos = call_end, eos
        self.done = False

    def __call__(self, output: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.done = self.done or self.call_end in self.reply.new_content(output)
        return force(logits, self.eos) if self.done else logits


class BanTokens:
    """tool_choice "none": the tools stay in the prompt (so it shares its cached prefix with the
    turns that may call them) and <tool_call> can never be sampled."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def __call__(self, output: list[int], logits: torch.Tensor) -> torch.Tensor:
        logits[self.tokens] = float("-inf")
        return logits


class LogitBias:
    """OpenAI's logit_bias: token id -> a value in [-100, 100] added to its logit."""

    def __init__(self, bias: dict[int, float]):
        self.ids = torch.tensor(list(bias), dtype=torch.int64)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32)

    def __call__(self, output: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.ids.device != logits.device:
            self.ids, self.values = self.ids.to(logits.device), self.values.to(logits.device)
        logits[self.ids] += self.values.to(logits.dtype)
        return logits

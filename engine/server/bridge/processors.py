"""Logits processors the server adds to requests: tool_choice none and logit_bias.

The engine calls each once per sampled token with the output so far and that step's logits [V].
"""

from __future__ import annotations

import torch


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

"""Fitting a conversation into the model's context.

A reply needs room: the prompt may take the context less what is kept for the reply (the reply's token
limit, at most a quarter of the context). When the conversation outgrows that, the "truncate" policy
leaves out its oldest turns (a turn: a user message and what answered it), keeping the system prompt and
the latest turn; "stop" sends nothing and lets the user choose. Counts come from the backend (the engine's
own template and tokenizer); a backend that cannot count (a remote server) is never truncated here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

def prompt_budget(max_context: int, max_tokens: int) -> int:
    """How many tokens the prompt may take, leaving room for a reply."""
    return max_context - max(1, min(max_tokens, max_context // 4))


@dataclass
class Fit:
    history: list[dict]
    tokens: int | None          # the prompt's tokens (None: the backend cannot count)
    left_out: int = 0           # messages left out from the start of the conversation


def fit_history(history: list[dict], count: Callable[[list[dict]], int | None], budget: int) -> Fit | None:
    """`history` as it is when it fits; else with the fewest oldest turns left out that makes it fit (a
    binary search over turn boundaries, a count per probe); None when even the latest turn alone does not."""
    tokens = count(history)
    if tokens is None or tokens <= budget:
        return Fit(history, tokens)
    system = history[:1] if history and history[0]["role"] == "system" else []
    rest = history[len(system):]
    starts = [i for i, m in enumerate(rest) if m["role"] == "user" and i > 0]
    lo, hi, best = 0, len(starts) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        trial = system + rest[starts[mid]:]
        n = count(trial)
        if n is not None and n <= budget:
            best, hi = Fit(trial, n, starts[mid]), mid - 1
        else:
            lo = mid + 1
    return best

"""What a chat backend (the local engine or a remote server) reports about one reply."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReplyResult:
    finish_reason: str                  # stop | length | tool_calls | cancelled | error
    error: str = ""
    text: str = ""                      # content the backend held back until the end (stop strings)
    reasoning: str = ""
    # calls the backend parsed out of the reply ({"name", "arguments": JSON text}): a remote server's, or the
    # local engine's when the request had tools; calls left in the text are found by app/chat/blocks.py
    tool_calls: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)      # prompt/cached/output/reasoning tokens, ttft_ms, tok_s,
    #                                                    tokens_per_round / drafts_kept (speculative decoding)


def metrics_from_engine(usage, timings) -> dict:
    metrics: dict[str, float] = {}
    if usage is not None:
        metrics.update(prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens,
                       output_tokens=usage.completion_tokens, reasoning_tokens=usage.reasoning_tokens)
        spec = usage.speculation
        if spec is not None and spec.rounds:
            metrics.update(tokens_per_round=spec.tokens_per_round, drafts_kept=spec.accepted / max(spec.drafted, 1),
                           draft_method=spec.method)
    if timings is not None:
        metrics.update(ttft_ms=timings.ttft_ms, tok_s=timings.decode_tok_s, total_ms=timings.total_ms)
    return metrics

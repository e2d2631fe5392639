"""The line of numbers under a reply."""

from __future__ import annotations

from app.formatting import human_tokens

FINISH_NOTES = {"length": "hit the token limit", "cancelled": "stopped", "error": "failed"}


def metrics_line(metrics: dict, finish_reason: str = "") -> str:
    parts = []
    if "ttft_ms" in metrics:
        parts.append(f"{metrics['ttft_ms'] / 1000:.2f} s to first token")
    if metrics.get("tok_s"):
        parts.append(f"{metrics['tok_s']:.1f} tok/s")
    if metrics.get("tokens_per_round"):
        by = {"dflash": "block drafter", "mtp": "MTP"}.get(metrics.get("draft_method", ""))
        parts.append(f"{metrics['tokens_per_round']:.2f} tokens per draft round ({metrics['drafts_kept']:.0%} of "
                     f"drafts kept{', ' + by if by else ''})")
    if "prompt_tokens" in metrics:
        prompt = f"{human_tokens(metrics['prompt_tokens'])} prompt"
        if metrics.get("cached_tokens"):
            prompt += f" ({human_tokens(metrics['cached_tokens'])} cached)"
        parts.append(prompt)
    if "output_tokens" in metrics:
        out = f"{human_tokens(metrics['output_tokens'])} output"
        if metrics.get("reasoning_tokens"):
            out += f" ({human_tokens(metrics['reasoning_tokens'])} thinking)"
        parts.append(out)
    if finish_reason in FINISH_NOTES:
        parts.append(FINISH_NOTES[finish_reason])
    return "  ·  ".join(parts)

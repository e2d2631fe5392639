"""Which drafted tokens a speculative round keeps, on the device, with no host sync.

Greedy rows keep the longest prefix of drafts equal to the target's argmax, then the target's next token. Sampled rows
use speculative rejection sampling: draft d_j (drawn from the draft distribution q_j) is kept with probability
min(1, p_j(d_j) / q_j(d_j)), p_j the target's distribution at that position after the request's temperature, top-k,
top-p and min-p; at the first rejection the token is drawn from max(0, p_j - q_j) renormalised, and when every draft
is kept a bonus token is drawn from the last row's p. The kept tokens are then distributed exactly as tokens sampled
one by one from p (Leviathan et al., Chen et al. 2023). Seeded rows instead draw each position's token from p with
the very uniforms plain decoding uses at that step (qwendesk_kernels/sampling.py) and keep the drafts that equal them:
the output is the plain seeded one, whatever the drafts (which depend on the cache: a prefix hit changes the MTP's KV at
its boundary), at a lower acceptance (sum p q instead of sum min(p, q)).
"""

from __future__ import annotations

import torch

from engine.core.sampling import Sampling
from qwendesk_kernels.sampling import filtered_probs_ref, race_ref, random_uniform_ref

# counter streams: a request's draws at generation step s use counter 4 s + stream
DRAFT, ACCEPT, RESIDUAL = 0, 1, 2


def _uniforms(s: Sampling, offset: int, stream: int, n: int) -> torch.Tensor:
    return random_uniform_ref(s.seeds, 4 * (s.steps + offset) + stream, n)


def draft_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The draft distribution q over the draft vocabulary [B, Vd] (rows with temperature 0: unused)."""
    return filtered_probs_ref(logits, s.temperature, s.top_k, s.top_p, s.min_p)


def pick_draft(logits: torch.Tensor, s: Sampling, j: int, sampled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft token j (1-based) of each row from the draft head's logits [B, Vd]: argmax for greedy rows, a draw
    from q for sampled ones. Returns (tokens [B], q [B, Vd] or None when every row is greedy)."""
    greedy = logits.argmax(-1)
    if not sampled:
        return greedy, None
    q = draft_probs(logits, s)
    return draw_draft(q, s, j, greedy), q


def draw_draft(q: torch.Tensor, s: Sampling, j: int, greedy: torch.Tensor) -> torch.Tensor:
    """Draft token j (1-based) of each row: a draw from q [B, Vd] (its own counter stream) where the row samples,
    `greedy` where it does not."""
    return torch.where(s.temperature > 0, race_ref(q, _uniforms(s, j, DRAFT, q.shape[-1])), greedy)


def accept(drafts: torch.Tensor, target_logits: torch.Tensor, s: Sampling, q: torch.Tensor | None):
    """drafts [B, k]; target_logits [B, k + 1, V] fp32 (row i predicts the token after the i-th verify input);
    q [B, k, Vd] the draft distributions (None: every row greedy). Returns (kept [B] int: leading drafts kept,
    tokens [B, k + 1]: tokens[:, :kept + 1] are the round's new tokens)."""
    B, k = drafts.shape
    targets = target_logits.argmax(-1)                                             # [B, k + 1]
    kept = (drafts == targets[:, :k]).int().cumprod(1).sum(1)
    if q is None:
        return kept, targets
    V = target_logits.shape[-1]
    rows = torch.arange(B, device=drafts.device)
    flat = target_logits.reshape(B * (k + 1), V)
    expand = s.rows(rows.repeat_interleave(k + 1))
    p = filtered_probs_ref(flat, expand.temperature, expand.top_k, expand.top_p, expand.min_p).view(B, k + 1, V)
    q_full = torch.zeros(B, k, V, device=q.device, dtype=q.dtype)
    q_full[..., :q.shape[-1]] = q
    p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)                        # [B, k]
    q_d = q_full.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.stack([_uniforms(s, j + 1, ACCEPT, 1)[:, 0] for j in range(k)], 1)
    ok = (u * q_d <= p_d).int().cumprod(1)
    sampled_kept = ok.sum(1)
    # the token after the kept drafts: from the residual at the first rejection, from p after the last draft
    at = sampled_kept.clamp(max=k)
    p_at = p[rows, at]
    residual = torch.where((at < k)[:, None], (p_at - q_full[rows, at.clamp(max=k - 1)]).clamp(min=0), p_at)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_at)
    u_extra = torch.stack([_uniforms(s, j + 1, RESIDUAL, V) for j in range(k + 1)], 1)[rows, at]
    extra = race_ref(residual, u_extra)
    tokens = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, at[:, None], extra[:, None])
    # seeded rows: the token plain decoding draws at each position (same uniforms), drafts kept while they match
    plain = torch.stack([race_ref(p[:, j], random_uniform_ref(s.seeds, s.steps + j, V)) for j in range(k + 1)], 1)
    plain_kept = (drafts == plain[:, :k]).int().cumprod(1).sum(1)
    sampled_kept = torch.where(s.seeded, plain_kept, sampled_kept)
    tokens = torch.where(s.seeded[:, None], plain, tokens)
    sampled = s.temperature > 0
    return torch.where(sampled, sampled_kept, kept), torch.where(sampled[:, None], tokens, targets)

"""DFlash and DFlash2 block drafters (arXiv 2602.06036; reference: z-lab/dflash, the `dflash` package).

A drafter is a few Qwen3-style decoder layers with no embedding or LM head of its own (it borrows the target's). It
reads the target's residual stream after a few of its layers (`target_layer_ids`), concatenated and projected by
`fc` + RMSNorm into context features; these enter each layer only through its k / v projections, as context K / V kept
across rounds. A round drafts a whole block in one forward: rows [anchor, MASK x (B - 1)] at positions start ..
start + B - 1 (the anchor is the last token the target chose, whose features are not known yet); rows 1 .. B - 1,
through the target's LM head, are the drafts. The block's own K / V are used in that forward only.

Attention: a full-attention layer sees the whole context and the whole block (no causal mask inside the block); a
sliding-attention layer is causal and sees the last `sliding_window` positions (the reference's rule, unless the
config sets `is_causal`). DFlash2 adds, in each layer, a 2-tap grouped dynamic causal convolution over the block
around attention and around the MLP, and picks the drafts with a candidate selector (the top-k of each row re-scored
left to right with low-rank predecessor / successor codebooks).

This module holds the drafter as its checkpoint lays it out and as the reference runs it, one sequence over a
`DrafterCache` (`extend`, `forward`: checked against the `dflash` package in tests/test_dflash.py). The engine runs
the same layers fused (engine/model/block_drafter.py BlockDrafter, loaded from these modules by `load_drafter`), with
the context K / V in the engine's CacheTensors (int8 beside a quantized KV format: KVFormat.drafter): a full layer's
in pages (`draft_k` / `draft_v`) at the same page and slot as the target's KV of that token, so a sequence's page
table, the prefix cache and its tiers carry them with no bookkeeping of their own; a sliding layer's in a ring per
state slot (`ring_k` / `ring_v`: the window and a block), carried with the GDN state. The target's forward writes
them for every row it computes (Qwen3_5Model.forward: prefill, decode and verify); a round's block writes its own K /
V at its rows' slots (past the committed tokens: overwritten by the verify that follows) and attends over them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.drafter_config import DrafterConfig

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]   # (q, k, v) of a layer -> its output


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm (weight x, not (1 + weight) x), in fp32."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding over the whole head (rotate-half), x [T, heads, D] at positions [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.float()[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], -1)[:, None, :]
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * angles.cos().to(x.dtype) + rotated * angles.sin().to(x.dtype)


class DynamicCausalConv(nn.Module):
    """DFlash2's grouped dynamic causal convolution over each block's rows: y[t] = sum_o (base[o] + dyn[t, o]) x[t - o]
    per channel group; `prepare` makes the kernels from its input and applies the first, `finish` the second."""

    def __init__(self, hidden: int, taps: int, group: int, projection: nn.Module | None = None,
                 base_kernel: torch.Tensor | None = None):
        """projection / base_kernel: the engine's (engine/model/block_drafter.py); default the checkpoint's."""
        super().__init__()
        self.taps, self.group = taps, group
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden) if base_kernel is None else base_kernel,
                                        requires_grad=base_kernel is None)
        self.kernel_projection = projection or nn.Linear(hidden, 2 * taps * (hidden // group), bias=False)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, block: int) -> torch.Tensor:
        """x [N * block, H] (N blocks back to back; the shift stays inside each), dynamic [N * block, taps, groups]."""
        R, H = x.shape
        groups = H // self.group
        blocks = x.view(R // block, block, groups, self.group)
        dyn = dynamic.view(R // block, block, self.taps, groups, 1)
        out = torch.zeros_like(blocks)
        for o in range(self.taps):
            shifted = blocks if o == 0 else F.pad(blocks[:, :-o], (0, 0, 0, 0, o, 0))
            out = out + base[o].view(groups, self.group).to(x.dtype) * shifted
            out = out + dyn[:, :, o] * shifted
        return out.view(R, H)

    def prepare(self, x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        dynamic = self.kernel_projection(x).view(x.shape[0], 2, self.taps, x.shape[1] // self.group)
        return self._convolve(x, dynamic[:, 0], self.base_kernel[0], block), dynamic[:, 1]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor, block: int) -> torch.Tensor:
        return self._convolve(x, dynamic, self.base_kernel[1], block)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim, self.theta = cfg.num_heads, cfg.num_kv_heads, d, cfg.rope_theta
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def q(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Queries [T, heads, D] of rows x [T, H], roped at `positions`."""
        return rope(self.q_norm(self.q_proj(x).view(x.shape[0], self.heads, self.head_dim)), positions, self.theta)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(K roped, V) [T, kv_heads, D] of rows x [T, H] at `positions`."""
        k = self.k_norm(self.k_proj(x).view(x.shape[0], self.kv_heads, self.head_dim))
        return rope(k, positions, self.theta), self.v_proj(x).view(x.shape[0], self.kv_heads, self.head_dim)


@dataclass
class DrafterCache:
    """One sequence's context K / V per layer ([L, kv_heads, D] for positions 0 .. L - 1): the projected target
    features of every token before the current anchor."""
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.k[0].shape[0]


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, index: int):
        super().__init__()
        self.index = index
        self.causal, self.window = cfg.causal(index), cfg.window(index)
        self.self_attn = Attention(cfg)
        self.mlp = _MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention_conv: DynamicCausalConv | None      # dflash2's (None: dflash)
        self.mlp_conv: DynamicCausalConv | None
        if cfg.variant == "dflash2":
            self.attention_conv = DynamicCausalConv(cfg.hidden_size, cfg.conv_kernel, cfg.conv_group)
            self.mlp_conv = DynamicCausalConv(cfg.hidden_size, cfg.conv_kernel, cfg.conv_group)
        else:
            self.attention_conv = self.mlp_conv = None

    def mask(self, start: int, rows: int, keys: int, device) -> torch.Tensor | None:
        """[rows, keys] of the block's rows (positions start ..) over the keys (positions 0 .. keys - 1)."""
        if not self.causal and self.window is None:
            return None
        q = start + torch.arange(rows, device=device)[:, None]
        k = torch.arange(keys, device=device)[None, :]
        visible = torch.ones(rows, keys, dtype=torch.bool, device=device)
        if self.causal:
            visible &= k <= q
        if self.window is not None:
            visible &= q - k < self.window
            if not self.causal:
                visible &= k - q < self.window
        return visible

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend, block: int) -> torch.Tensor:
        """x [N * block, H]: N blocks' rows at `positions`; attend(q, k, v) -> [rows, heads, D] over this layer's
        context and the block's own K / V (q [rows, heads, D], k / v [rows, kv_heads, D], roped)."""
        attn = self.self_attn
        residual = x
        h = self.input_layernorm(x)
        kernel = None
        if self.attention_conv is not None:
            h, kernel = self.attention_conv.prepare(h, block)
        k, v = attn.kv(h, positions)
        out = attend(attn.q(h, positions), k, v)
        h = attn.o_proj(out.reshape(x.shape[0], -1))
        if self.attention_conv is not None and kernel is not None:
            h = self.attention_conv.finish(h, kernel, block)
        x = residual + h
        residual = x
        h = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            h, kernel = self.mlp_conv.prepare(h, block)
        h = self.mlp(h)
        if self.mlp_conv is not None:
            h = self.mlp_conv.finish(h, kernel, block)
        return residual + h


class _MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class CandidateSelector(nn.Module):
    """DFlash2: each draft row keeps its top-k tokens by logit; left to right, a candidate's score is its logit plus
    <predecessor code (x) projected row hidden, successor code>, and the best (or a sample) is the row's draft."""

    def __init__(self, cfg: DrafterConfig, projection: nn.Module | None = None,
                 predecessor: torch.Tensor | None = None, successor: torch.Tensor | None = None):
        """projection and the codebooks: the engine's (engine/model/block_drafter.py); default the checkpoint's."""
        super().__init__()
        self.top_k = cfg.selector_top_k
        shape = (cfg.vocab_size, cfg.selector_rank)
        self.predecessor_codebook = nn.Parameter(torch.zeros(shape) if predecessor is None else predecessor,
                                                 requires_grad=predecessor is None)
        self.successor_codebook = nn.Parameter(torch.zeros(shape) if successor is None else successor,
                                               requires_grad=successor is None)
        self.hidden_projection = projection or nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def candidates(self, hidden: torch.Tensor, logits: torch.Tensor):
        """(unary logits [..., k], candidate ids [..., k], projected hidden [..., rank]) of rows hidden / logits."""
        unary, candidates = torch.topk(logits.float(), self.top_k, dim=-1, sorted=False)
        return unary, candidates, self.hidden_projection(hidden).float()

    def scores(self, unary, candidates, projected, previous: torch.Tensor) -> torch.Tensor:
        """One row's candidate scores given the token before it (batched over a leading dim, or not)."""
        pred = self.predecessor_codebook[previous].float() * projected
        return unary + (self.successor_codebook[candidates].float() @ pred[..., None])[..., 0]

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int,
               generator: torch.Generator | None = None, temperature: float = 0.0):
        """hidden [R, H], logits [R, V] of the draft rows -> (drafts [R], candidates [R, k], the selector's
        probabilities [R, k] when sampling, else None)."""
        unary, candidates, projected = self.candidates(hidden, logits)
        pred = torch.tensor(anchor, device=hidden.device)
        drafts, probs = [], []
        for r in range(hidden.shape[0]):
            scores = self.scores(unary[r], candidates[r], projected[r], pred)
            if temperature > 0:
                q = torch.softmax(scores / temperature, -1)
                index = torch.multinomial(q, 1, generator=generator)[0]
                probs.append(q)
            else:
                index = torch.argmax(scores)
            pred = candidates[r, index]
            drafts.append(pred)
        return torch.stack(drafts), candidates, torch.stack(probs) if probs else None


class Drafter(nn.Module):
    """The drafter's weights (checkpoint names) and its forwards (see the module docstring)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.candidate_selector = CandidateSelector(cfg) if cfg.variant == "dflash2" else None
        self.taps = {layer: i for i, layer in enumerate(cfg.target_layer_ids)}   # target layer -> its slice of fc

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Tapped target features [T, len(taps) x H] -> the context rows [T, H] every layer's k / v read."""
        return self.hidden_norm(self.fc(features))

    # ---- one sequence, the reference's way -------------------------------------------------------------------------
    def new_cache(self, device=None, dtype=None) -> DrafterCache:
        p = self.fc.weight
        empty = torch.empty(0, self.cfg.num_kv_heads, self.cfg.head_dim, device=device or p.device,
                            dtype=dtype or p.dtype)
        return DrafterCache([empty] * self.cfg.num_layers, [empty] * self.cfg.num_layers)

    def extend(self, cache: DrafterCache, features: torch.Tensor) -> None:
        """Add the tapped target features [n, len(taps) x H] of the next n tokens (positions cache.length ..) to the
        context: projected, then each layer's K / V of them appended."""
        if features.shape[0] == 0:
            return
        ctx = self.context(features)
        positions = cache.length + torch.arange(features.shape[0], device=features.device)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, positions)
            cache.k[i], cache.v[i] = torch.cat([cache.k[i], k]), torch.cat([cache.v[i], v])

    def forward(self, block: torch.Tensor, cache: DrafterCache) -> torch.Tensor:
        """block [B, H]: the target's embeddings of [anchor, MASK x (B - 1)] (times embedding_scale) at positions
        cache.length ..; -> the final-normed hidden states [B, H] (rows 1 .. B - 1 make the drafts)."""
        x, start, rows = block, cache.length, block.shape[0]
        positions = start + torch.arange(rows, device=x.device)
        for i, layer in enumerate(self.layers):
            def attend(q, k, v, i=i, layer=layer):
                k, v = torch.cat([cache.k[i], k]).transpose(0, 1), torch.cat([cache.v[i], v]).transpose(0, 1)
                groups = q.shape[1] // k.shape[0]
                k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
                mask = layer.mask(start, rows, k.shape[1], q.device)
                return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1)
            x = layer(x, positions, attend, rows)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, head) -> torch.Tensor:
        return draft_logits(self.cfg, hidden, head)

    def crop(self, cache: DrafterCache, length: int) -> None:
        """Forget the context past `length` tokens (a cancelled or rewound sequence)."""
        cache.k = [k[:length] for k in cache.k]
        cache.v = [v[:length] for v in cache.v]


def draft_logits(cfg: DrafterConfig, hidden: torch.Tensor, head) -> torch.Tensor:
    """Draft logits of hidden rows through the target's LM head `head` (a callable), scaled and soft-capped as the
    config says."""
    logits = head(hidden) * cfg.output_multiplier
    if cfg.logit_softcap:
        logits = torch.tanh(logits / cfg.logit_softcap) * cfg.logit_softcap
    return logits

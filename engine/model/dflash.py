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

This file is the model in plain torch, one sequence at a time, checked against the reference
(tests/test_dflash.py); the engine's rounds (batched, paged, graphed) build on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from engine.weights.checkpoint import TensorReader, list_tensors

VARIANTS = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}


class DrafterMismatch(ValueError):
    """A drafter that cannot serve this target (one line, for the user)."""


@dataclass(frozen=True)
class DrafterConfig:
    variant: str                          # "dflash" | "dflash2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    layer_types: tuple[str, ...]          # "full_attention" | "sliding_attention" per layer
    sliding_window: int | None
    is_causal: bool | None                # None: the reference's rule (sliding layers causal, full ones not)
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    block_size: int
    mask_token_id: int
    embedding_scale: float = 1.0          # the target's embeddings of the block are multiplied by this
    output_multiplier: float = 1.0        # and the draft logits by this
    logit_softcap: float | None = None
    conv_kernel: int = 0                  # DFlash2: the dynamic convolution's taps and channel group
    conv_group: int = 0
    selector_rank: int = 0                # DFlash2: the candidate selector's codebook rank and candidates per row
    selector_top_k: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    def causal(self, layer: int) -> bool:
        sliding = self.layer_types[layer] == "sliding_attention"
        return sliding if self.is_causal is None else self.is_causal

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference's taps when a config names none: evenly from layer 1 to num_target_layers - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def parse_drafter_config(raw: dict) -> DrafterConfig:
    """DrafterConfig from a drafter checkpoint's config.json (the `dflash_config` block overrides top-level keys)."""
    arch = (raw.get("architectures") or [""])[0]
    if arch not in VARIANTS:
        raise DrafterMismatch(f"not a DFlash drafter: architecture {arch or 'missing'!r} (supported: "
                              f"{', '.join(VARIANTS)})")
    extra = dict(raw.get("dflash_config") or {})

    def value(name, default=None):
        return extra.get(name, raw.get(name, default))

    layers = int(raw["num_hidden_layers"])
    heads = int(raw["num_attention_heads"])
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise DrafterMismatch(f"drafter RoPE type {rope['rope_type']!r} is not supported")
    mask = value("mask_token_id")
    if mask is None:
        raise DrafterMismatch("drafter config has no mask_token_id")
    n_target = value("num_target_layers")
    taps = value("target_layer_ids") or default_target_layer_ids(int(n_target), layers)
    softcap = value("final_logit_softcapping")
    variant = VARIANTS[arch]
    return DrafterConfig(
        variant=variant, vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]), num_layers=layers, num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        attention_bias=bool(raw.get("attention_bias", False)),
        layer_types=tuple(raw.get("layer_types") or ["full_attention"] * layers),
        sliding_window=raw.get("sliding_window"), is_causal=raw.get("is_causal"),
        target_layer_ids=tuple(int(i) for i in taps), num_target_layers=None if n_target is None else int(n_target),
        block_size=int(value("block_size", 16)), mask_token_id=int(mask),
        embedding_scale=float(value("input_embedding_scale", 1.0)),
        output_multiplier=float(value("output_multiplier", 1.0)),
        logit_softcap=float(softcap) if softcap else None,
        conv_kernel=int(value("conv_kernel_size", 0)) if variant == "dflash2" else 0,
        conv_group=int(value("conv_group_size", 0)) if variant == "dflash2" else 0,
        selector_rank=int(value("selector_rank", 0)) if variant == "dflash2" else 0,
        selector_top_k=int(value("selector_top_k", 0)) if variant == "dflash2" else 0,
        extra=extra)


def check_drafter(cfg: DrafterConfig, target: ModelConfig) -> None:
    """Refuse, in one line, a drafter that was not made for this target."""
    if cfg.hidden_size != target.hidden_size:
        raise DrafterMismatch(f"the drafter has hidden size {cfg.hidden_size}, the model {target.hidden_size}: it is "
                              f"for another model")
    if cfg.vocab_size != target.vocab_size:
        raise DrafterMismatch(f"the drafter has a vocabulary of {cfg.vocab_size}, the model {target.vocab_size}")
    if cfg.num_target_layers is not None and cfg.num_target_layers != target.num_layers:
        raise DrafterMismatch(f"the drafter is for a model of {cfg.num_target_layers} layers, this one has "
                              f"{target.num_layers}")
    if not cfg.target_layer_ids or max(cfg.target_layer_ids) >= target.num_layers or min(cfg.target_layer_ids) < 0:
        raise DrafterMismatch(f"the drafter reads layers {list(cfg.target_layer_ids)}, the model has "
                              f"{target.num_layers}")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise DrafterMismatch(f"the drafter's mask token {cfg.mask_token_id} is outside the vocabulary")
    if cfg.variant == "dflash2" and not (cfg.conv_kernel and cfg.conv_group and cfg.selector_rank
                                         and cfg.selector_top_k):
        raise DrafterMismatch("DFlash2 drafter config lacks its convolution or selector sizes")


# ---- layers ----------------------------------------------------------------------------------------------------

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
    """Rotary embedding over the whole head (rotate-half), x [..., T, D] at positions [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class DynamicCausalConv(nn.Module):
    """DFlash2's grouped dynamic causal convolution over the block's rows: y[t] = sum_o (base[o] + dyn[t, o]) x[t - o]
    per channel group; `prepare` makes the kernels from its input and applies the first, `finish` the second."""

    def __init__(self, hidden: int, taps: int, group: int):
        super().__init__()
        self.taps, self.group = taps, group
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * (hidden // group), bias=False)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        B, H = x.shape
        groups = H // self.group
        blocks = x.view(B, groups, self.group)
        out = torch.zeros_like(blocks)
        for o in range(self.taps):
            shifted = blocks if o == 0 else F.pad(blocks[:-o], (0, 0, 0, 0, o, 0))
            out = out + base[o].view(groups, self.group).to(x.dtype) * shifted
            out = out + dynamic[:, o].view(B, groups, 1) * shifted
        return out.view(B, H)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dynamic = self.kernel_projection(x).view(x.shape[0], 2, self.taps, x.shape[1] // self.group)
        return self._convolve(x, dynamic[:, 0], self.base_kernel[0]), dynamic[:, 1]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, dynamic, self.base_kernel[1])


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, positions: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(K roped, V) [kv_heads, T, D] of rows x [T, H] at `positions`."""
        k = self.k_norm(self.k_proj(x).view(x.shape[0], self.kv_heads, self.head_dim)).transpose(0, 1)
        v = self.v_proj(x).view(x.shape[0], self.kv_heads, self.head_dim).transpose(0, 1)
        return rope(k, positions, theta), v


@dataclass
class DrafterCache:
    """One sequence's context K / V per layer ([kv_heads, L, D] for positions 0 .. L - 1): the projected target
    features of every token before the current anchor (sliding layers would need only their window)."""
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.k[0].shape[1]


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, index: int):
        super().__init__()
        self.index = index
        self.causal, self.window = cfg.causal(index), cfg.window(index)
        self.self_attn = Attention(cfg)
        self.mlp = _MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
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

    def forward(self, x: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor, start: int,
                theta: float) -> torch.Tensor:
        """x [B, H]: the block's rows at positions start .. start + B - 1, over the context K / V [kv, start, D]."""
        attn = self.self_attn
        residual = x
        h = self.input_layernorm(x)
        kernel = None
        if self.attention_conv is not None:
            h, kernel = self.attention_conv.prepare(h)
        positions = start + torch.arange(x.shape[0], device=x.device)
        q = attn.q_norm(attn.q_proj(h).view(x.shape[0], attn.heads, attn.head_dim)).transpose(0, 1)
        q = rope(q, positions, theta)
        k, v = attn.kv(h, positions, theta)
        k, v = torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1)
        groups = attn.heads // attn.kv_heads
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(start, x.shape[0], k.shape[1], x.device))
        h = attn.o_proj(out.transpose(0, 1).reshape(x.shape[0], -1))
        if kernel is not None:
            h = self.attention_conv.finish(h, kernel)
        x = residual + h
        residual = x
        h = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            h, kernel = self.mlp_conv.prepare(h)
        h = self.mlp(h)
        if self.mlp_conv is not None:
            h = self.mlp_conv.finish(h, kernel)
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

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))
        self.successor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: int,
               generator: torch.Generator | None = None, temperature: float = 0.0):
        """hidden [R, H], logits [R, V] of the draft rows -> (drafts [R], candidates [R, k], the selector's
        probabilities [R, k] when sampling, else None)."""
        unary, candidates = torch.topk(logits.float(), self.top_k, dim=-1, sorted=False)
        projected = self.hidden_projection(hidden).float()
        pred = torch.tensor(anchor, device=hidden.device)
        drafts, probs = [], []
        for r in range(hidden.shape[0]):
            scores = unary[r] + (self.successor_codebook[candidates[r]].float()
                                 @ (self.predecessor_codebook[pred].float() * projected[r]))
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
    """The drafter's weights (checkpoint names) and its forward over one sequence's block."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.candidate_selector = CandidateSelector(cfg) if cfg.variant == "dflash2" else None

    def new_cache(self, device=None, dtype=None) -> DrafterCache:
        p = self.fc.weight
        empty = torch.empty(self.cfg.num_kv_heads, 0, self.cfg.head_dim, device=device or p.device,
                            dtype=dtype or p.dtype)
        return DrafterCache([empty] * self.cfg.num_layers, [empty] * self.cfg.num_layers)

    def extend(self, cache: DrafterCache, features: torch.Tensor) -> None:
        """Add the tapped target features [n, len(taps) x H] of the next n tokens (positions cache.length ..) to the
        context: projected, then each layer's K / V of them appended."""
        if features.shape[0] == 0:
            return
        ctx = self.hidden_norm(self.fc(features))
        positions = cache.length + torch.arange(features.shape[0], device=features.device)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, positions, self.cfg.rope_theta)
            cache.k[i], cache.v[i] = torch.cat([cache.k[i], k], 1), torch.cat([cache.v[i], v], 1)

    def forward(self, block: torch.Tensor, cache: DrafterCache) -> torch.Tensor:
        """block [B, H]: the target's embeddings of [anchor, MASK x (B - 1)] (times embedding_scale) at positions
        cache.length ..; -> the final-normed hidden states [B, H] (rows 1 .. B - 1 make the drafts)."""
        x, start = block, cache.length
        for i, layer in enumerate(self.layers):
            x = layer(x, cache.k[i], cache.v[i], start, self.cfg.rope_theta)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, head) -> torch.Tensor:
        """Draft logits of hidden rows through the target's LM head `head` (a callable), scaled and soft-capped as
        the config says."""
        logits = head(hidden) * self.cfg.output_multiplier
        if self.cfg.logit_softcap:
            logits = torch.tanh(logits / self.cfg.logit_softcap) * self.cfg.logit_softcap
        return logits

    def crop(self, cache: DrafterCache, length: int) -> None:
        """Forget the context past `length` tokens (a cancelled or rewound sequence)."""
        cache.k = [k[:, :length] for k in cache.k]
        cache.v = [v[:, :length] for v in cache.v]


def load_drafter(path, target: ModelConfig, device="cpu", dtype: torch.dtype = torch.bfloat16) -> Drafter:
    """The drafter checkpoint at `path` (config.json + safetensors, as z-lab publishes them) for `target`: refused in
    one line (DrafterMismatch) when it was made for another model or lacks a weight."""
    path = Path(path)
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DrafterMismatch(f"no readable drafter config.json in {path}: {e}") from None
    cfg = parse_drafter_config(raw)
    check_drafter(cfg, target)
    with torch.device("meta"):
        drafter = Drafter(cfg)
    tensors, reader = list_tensors(path), TensorReader("cpu")
    wanted = dict(drafter.named_parameters())
    missing = sorted(set(wanted) - set(tensors))
    if missing:
        raise DrafterMismatch(f"the drafter checkpoint lacks {len(missing)} weight(s), e.g. {missing[0]}")
    state = {}
    for name, p in wanted.items():
        t = reader.get(tensors[name])
        if tuple(t.shape) != tuple(p.shape):
            raise DrafterMismatch(f"drafter weight {name} has shape {tuple(t.shape)}, its config needs "
                                  f"{tuple(p.shape)}")
        state[name] = t.to(device=device, dtype=dtype)
    reader.close()
    drafter.load_state_dict(state, assign=True)
    return drafter.eval()

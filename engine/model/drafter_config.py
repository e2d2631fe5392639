"""A DFlash / DFlash2 drafter checkpoint's config (arXiv 2602.06036; z-lab/dflash): parsed from its config.json,
checked against the target it is meant for, with one-line refusals (DrafterMismatch), and what it costs in memory."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.cache.kv_format import KVFormat
from engine.model.config import ModelConfig

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

    @property
    def ring_layers(self) -> tuple[bool, ...]:
        """Per layer: its context K / V live in a ring per state slot (a sliding-window layer: only the window's keys
        are kept), else in pages with the sequence."""
        return tuple(self.window(i) is not None for i in range(self.num_layers))

    def ring_tokens(self, page_size: int) -> int:
        """Tokens of context a ring keeps (0: no ring layer): the window and a block (a block's rows see up to a window
        behind them and write their own K / V ahead), and a page more, so that a prefill step can take a prefix
        snapshot in passing up to a page and a block before its end (CacheTensors.snapshot_tail); whole pages, read
        through a page table."""
        if not any(self.ring_layers):
            return 0
        assert self.sliding_window is not None
        return -(-(self.sliding_window + self.block_size) // page_size) * page_size + page_size


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
    if raw.get("attention_bias"):
        raise DrafterMismatch("drafters with attention biases are not supported (the published DFlash drafters "
                              "have none)")
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


def read_drafter_config(path) -> DrafterConfig:
    """The DrafterConfig of the checkpoint folder at `path` (DrafterMismatch when it has no readable config)."""
    path = Path(path)
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DrafterMismatch(f"no readable drafter config.json in {path}: {e}") from None
    return parse_drafter_config(raw)


def check_drafter_folder(drafter: str | Path, model: str | Path) -> str:
    """Whether the folder `drafter` holds a drafter made for the checkpoint `model`: "" when it does, else the one-line
    reason (what Settings shows before anything loads)."""
    from engine.model.config import load_model_config
    try:
        check_drafter(read_drafter_config(drafter), load_model_config(model))
    except (OSError, ValueError) as e:
        return str(e)
    return ""


def drafter_tensor_shapes(cfg: DrafterConfig) -> dict[str, tuple[tuple[int, ...], int]]:
    """The drafter's weights as its checkpoint names them: name -> (shape, 2 bytes an element), as
    engine/model/shapes.py lists the target's (the planner prices them under the quantization policy)."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    out = {"fc.weight": (h, len(cfg.target_layer_ids) * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (cfg.num_heads * d, h),
                    p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
                    p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
                    p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
                    p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                    p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                    p + "mlp.down_proj.weight": (h, inter),
                    p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if cfg.conv_kernel:
            for conv in ("attention_conv", "mlp_conv"):
                out.update({f"{p}{conv}.base_kernel": (2, cfg.conv_kernel, h),
                            f"{p}{conv}.kernel_projection.weight": (2 * cfg.conv_kernel * (h // cfg.conv_group), h)})
    if cfg.selector_rank:
        out.update({"candidate_selector.predecessor_codebook": (cfg.vocab_size, cfg.selector_rank),
                    "candidate_selector.successor_codebook": (cfg.vocab_size, cfg.selector_rank),
                    "candidate_selector.hidden_projection.weight": (cfg.selector_rank, h)})
    return {name: (shape, 2) for name, shape in out.items()}


def drafter_parameters(cfg: DrafterConfig) -> int:
    """The drafter's weights, counted from its config (the planner's figure before anything loads)."""
    return sum(math.prod(shape) for shape, _ in drafter_tensor_shapes(cfg).values())


def drafter_kv_bytes_per_token(cfg: DrafterConfig, kv: KVFormat, dtype: torch.dtype) -> int:
    """K and V of one token in every drafter layer whose context is paged with the sequence (the full-attention ones)
    beside the model's KV format `kv` (KVFormat.drafter: int8 beside a quantized one)."""
    paged = cfg.ring_layers.count(False)
    return paged * cfg.num_kv_heads * kv.drafter.bytes_per_head_token(cfg.head_dim, dtype)


def drafter_ring_bytes_per_slot(cfg: DrafterConfig, kv: KVFormat, dtype: torch.dtype, page_size: int) -> int:
    """K and V a state slot holds of the sliding-window layers' context (a ring of ring_tokens each)."""
    rings = cfg.ring_layers.count(True)
    return rings * cfg.ring_tokens(page_size) * cfg.num_kv_heads * kv.drafter.bytes_per_head_token(cfg.head_dim, dtype)

"""ModelConfig: the architecture facts the engine needs, read from a checkpoint's config.json.

Supported: `qwen3_5` (the multimodal wrapper with `text_config` / `vision_config`), `qwen3_5_text` (text only)
and their mixture-of-experts forms `qwen3_5_moe` / `qwen3_5_moe_text` (the 35B-A3B: every layer's MLP is a routed
sparse MoE block with a shared expert). Everything else is refused with a message naming what works.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
WRAPPER_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")      # text_config + vision_config


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int
    out_hidden_size: int
    num_position_embeddings: int
    hidden_act: str = "gelu_pytorch_tanh"   # the blocks' MLP (the merger's GELU is exact)
    rope_theta: float = 10_000.0            # the 2D rotary of the blocks' attention

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int                # the dense MLP's (0 in an MoE model)
    num_layers: int
    layer_types: tuple[str, ...]          # "linear_attention" | "full_attention" per layer
    # gated full attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int                       # leading dims of each head that RoPE rotates
    rope_theta: float
    mrope_section: tuple[int, int, int]   # (t, h, w): interleaved frequency counts per position axis
    # gated delta net
    linear_num_k_heads: int
    linear_num_v_heads: int
    linear_k_head_dim: int
    linear_v_head_dim: int
    conv_kernel: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    num_mtp_layers: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...] = ()
    vision: VisionConfig | None = None
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    dtype: str = "bfloat16"               # torch_dtype / dtype the checkpoint declares
    # mixture of experts (qwen3_5_moe): every layer's MLP routes each token to num_experts_per_tok of num_experts
    # (softmax, top-k, renormalised) and adds a shared expert scaled by a sigmoid gate; 0 experts: dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    quantization: dict = field(default_factory=dict, compare=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def shared_expert_stacked(self) -> bool:
        """The shared expert has the routed experts' width (the 35B-A3B's): it is stacked with them as expert E and
        every token gets it as a (k + 1)-th routed pair (engine/model/moe.py)."""
        return self.is_moe and self.shared_expert_intermediate_size == self.moe_intermediate_size

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def linear_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_k_heads * self.linear_k_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_v_heads * self.linear_v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN causal conv: q | k | v."""
        return 2 * self.linear_key_dim + self.linear_value_dim


def load_model_config(path: str | Path) -> ModelConfig:
    """Read `config.json` from a checkpoint directory (or the file itself)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no config.json in {path}: not a Hugging Face checkpoint directory")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None
    return parse_model_config(raw)


def parse_model_config(raw: dict) -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = ", ".join(raw.get("architectures") or []) or "unknown architecture"
        raise UnsupportedModelError(
            f"unsupported model_type {model_type!r} ({arch}); Qwen Desk runs the Qwen3.5 family "
            f"(Qwen3.5 / 3.6 / 3.8 checkpoints, model_type one of {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if model_type in WRAPPER_MODEL_TYPES:
        text = dict(raw.get("text_config") or {})
        vision_raw = raw.get("vision_config")
        top = raw
    else:
        text, vision_raw, top = raw, None, {}
    moe = model_type.startswith("qwen3_5_moe")
    if bool(text.get("num_experts")) != moe:
        raise UnsupportedModelError(f"a {model_type} config.json with num_experts={text.get('num_experts')!r}: "
                                    f"experts belong to qwen3_5_moe checkpoints only")

    def need(key):
        if key not in text:
            raise ValueError(f"config.json lacks {key!r}, which a {model_type} checkpoint must have")
        return text[key]

    experts = {}
    if moe:     # transformers' Qwen3_5MoeTextConfig: all layers sparse, top-k always renormalised
        experts = dict(num_experts=need("num_experts"), num_experts_per_tok=need("num_experts_per_tok"),
                       moe_intermediate_size=need("moe_intermediate_size"),
                       shared_expert_intermediate_size=need("shared_expert_intermediate_size"))
        if not 0 < experts["num_experts_per_tok"] <= experts["num_experts"]:
            raise ValueError(f"num_experts_per_tok must be 1..num_experts ({experts['num_experts']}), "
                             f"not {experts['num_experts_per_tok']}")

    num_layers = need("num_hidden_layers")
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = text.get("full_attention_interval", 4)
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if len(layer_types) != num_layers or set(layer_types) - {"full_attention", "linear_attention"}:
        raise ValueError(f"layer_types must list 'full_attention'/'linear_attention' for all {num_layers} layers")

    rope: dict[str, Any] = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_theta = rope.get("rope_theta", text.get("rope_theta", 10_000_000.0))
    if rope_theta is None:
        raise ValueError("config.json's rope_theta is null")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported (only default / mrope)")
    partial = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    head_dim = text.get("head_dim") or need("hidden_size") // need("num_attention_heads")
    rotary_dim = int(head_dim * partial)
    section = tuple(rope.get("mrope_section") or (11, 11, 10))

    eos = top.get("eos_token_id", text.get("eos_token_id"))
    eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())

    vision = None
    if vision_raw:
        vision_rope = vision_raw.get("rope_parameters") or {}
        vision = VisionConfig(
            depth=vision_raw.get("depth", 27),
            hidden_size=vision_raw.get("hidden_size", 1152),
            num_heads=vision_raw.get("num_heads", 16),
            intermediate_size=vision_raw.get("intermediate_size", 4304),
            patch_size=vision_raw.get("patch_size", 16),
            temporal_patch_size=vision_raw.get("temporal_patch_size", 2),
            spatial_merge_size=vision_raw.get("spatial_merge_size", 2),
            in_channels=vision_raw.get("in_channels", 3),
            out_hidden_size=vision_raw.get("out_hidden_size", need("hidden_size")),
            num_position_embeddings=vision_raw.get("num_position_embeddings", 2304),
            hidden_act=vision_raw.get("hidden_act", "gelu_pytorch_tanh"),
            rope_theta=float(vision_rope.get("rope_theta", vision_raw.get("rope_theta", 10_000.0))),
        )

    tie = top.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=need("vocab_size"),
        hidden_size=need("hidden_size"),
        intermediate_size=text.get("intermediate_size", 0) if moe else need("intermediate_size"),
        num_layers=num_layers,
        layer_types=tuple(layer_types),
        num_heads=need("num_attention_heads"),
        num_kv_heads=need("num_key_value_heads"),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=float(rope_theta),
        mrope_section=section,
        linear_num_k_heads=text.get("linear_num_key_heads", 16),
        linear_num_v_heads=text.get("linear_num_value_heads", 32),
        linear_k_head_dim=text.get("linear_key_head_dim", 128),
        linear_v_head_dim=text.get("linear_value_head_dim", 128),
        conv_kernel=text.get("linear_conv_kernel_dim", 4),
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(tie),
        num_mtp_layers=text.get("mtp_num_hidden_layers", 0),
        max_position_embeddings=text.get("max_position_embeddings", 262144),
        eos_token_ids=eos,
        vision=vision,
        image_token_id=top.get("image_token_id"),
        video_token_id=top.get("video_token_id"),
        vision_start_token_id=top.get("vision_start_token_id"),
        vision_end_token_id=top.get("vision_end_token_id"),
        dtype=str(text.get("dtype") or text.get("torch_dtype") or top.get("torch_dtype") or "bfloat16"),
        quantization=dict(top.get("quantization_config") or text.get("quantization_config") or {}),
        **experts,
    )

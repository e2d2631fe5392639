"""The checkpoint tensors a model has, with their shapes, without allocating: what the planner counts."""

from __future__ import annotations

from functools import lru_cache

import torch

from engine.model.config import ModelConfig
from engine.model.qwen3_5 import Qwen3_5Model


@lru_cache(maxsize=32)
def model_tensor_shapes(cfg: ModelConfig, with_mtp: bool = True,
                        with_vision: bool = True) -> dict[str, tuple[tuple, int]]:
    """Checkpoint tensor name -> (shape, element size kept at 16 bits) for a ModelConfig, without allocating:
    the text model is built on the meta device so the shapes are the model's own. Cached: the app plans every
    catalog entry and profile with it."""
    model = Qwen3_5Model(cfg, torch.bfloat16, "meta", with_mtp=with_mtp)
    out = {name: (tuple(shape), target.element_size() if isinstance(target, torch.Tensor) else 2)
           for name, target, _, shape in model.checkpoint_slices()}
    if with_vision and cfg.vision is not None:
        out.update({f"model.visual.{n}": (s, 2) for n, s in vision_tensor_shapes(cfg.vision).items()})
    return out


def vision_tensor_shapes(v) -> dict[str, tuple]:
    """The vision tower's checkpoint tensors (names under model.visual.) and their shapes."""
    h, m = v.hidden_size, v.hidden_size * v.spatial_merge_size ** 2
    shapes = {"patch_embed.proj.weight": (h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size),
              "patch_embed.proj.bias": (h,), "pos_embed.weight": (v.num_position_embeddings, h),
              "merger.norm.weight": (h,), "merger.norm.bias": (h,),
              "merger.linear_fc1.weight": (m, m), "merger.linear_fc1.bias": (m,),
              "merger.linear_fc2.weight": (v.out_hidden_size, m), "merger.linear_fc2.bias": (v.out_hidden_size,)}
    for i in range(v.depth):
        b = f"blocks.{i}."
        for name, shape in (("norm1", (h,)), ("norm2", (h,))):
            shapes[f"{b}{name}.weight"] = shapes[f"{b}{name}.bias"] = shape
        for name, out, inp in (("attn.qkv", 3 * h, h), ("attn.proj", h, h),
                               ("mlp.linear_fc1", v.intermediate_size, h), ("mlp.linear_fc2", h, v.intermediate_size)):
            shapes[f"{b}{name}.weight"], shapes[f"{b}{name}.bias"] = (out, inp), (out,)
    return shapes

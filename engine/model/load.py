"""Build a model from a checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.model.config import load_model_config
from engine.model.qwen3_5 import Qwen3_5Model
from engine.weights.loader import checkpoint_has_mtp, load_weights


def load_model(path: str | Path, device="cpu", dtype: torch.dtype = torch.bfloat16, mtp: bool = False,
               vision: bool = False, policy=None, progress=None):
    """-> (model, vision tensors). MTP is built when asked for and the checkpoint carries it.
    policy: which weights to quantize (engine.weights.policy.QuantPolicy; None: all in `dtype`)."""
    cfg = load_model_config(path)
    with_mtp = mtp and cfg.num_mtp_layers > 0 and checkpoint_has_mtp(path)
    model = Qwen3_5Model(cfg, dtype, device, with_mtp=with_mtp, policy=policy)
    vision_tensors = load_weights(model, path, device, keep_vision=vision and cfg.vision is not None,
                                  policy=policy, progress=progress)
    return model.eval(), vision_tensors

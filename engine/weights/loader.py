"""Load a checkpoint's tensors into the engine's model, one tensor at a time.

Checkpoint names come in two spellings: `model.language_model.*` (the multimodal `qwen3_5`
wrapper) and `model.*` (text-only). `lm_head.weight`, `mtp.*` and `model.visual.*` sit beside
them. Each tensor is read onto the target device, cast, copied into its (possibly fused)
parameter and dropped, so host and device never hold the checkpoint twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from engine.weights.checkpoint import CheckpointError, TensorReader, canonical_name, list_tensors

def checkpoint_has_mtp(path: str | Path) -> bool:
    return any(n.startswith("mtp.") for n in list_tensors(path))


def _match(model, names) -> tuple[dict, dict, dict]:
    """Checkpoint names -> (model targets by name, source name by target, vision names);
    raises CheckpointError on missing or unexpected tensors."""
    targets = {name: (param, row, shape) for name, param, row, shape in model.checkpoint_slices()}
    found, vision, unexpected = {}, {}, []
    for full in names:
        kind, name = canonical_name(full)
        if kind == "vision":
            vision[name] = full
        elif name in targets:
            found[name] = full
        elif kind == "mtp" and model.mtp is None:
            continue  # the checkpoint has MTP weights; speculation is off for this load
        elif name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and model.cfg.tie_word_embeddings):
            continue
        else:
            unexpected.append(full)
    missing = sorted(set(targets) - set(found))
    if missing:
        raise CheckpointError(f"the checkpoint lacks {len(missing)} tensor(s) the model needs, "
                              f"e.g. {', '.join(missing[:3])}")
    if unexpected:
        raise CheckpointError(f"the checkpoint has {len(unexpected)} tensor(s) this architecture does not use, "
                              f"e.g. {', '.join(sorted(unexpected)[:3])}")
    return targets, found, vision


def _copy(param, row, shape, tensor) -> None:
    rows = shape[0]
    param[row:row + rows].copy_(tensor.reshape(rows, *param.shape[1:]))


def load_weights(model, path: str | Path, device, keep_vision: bool = True,
                 progress: Callable[[int, int], None] | None = None) -> dict[str, torch.Tensor]:
    """Fill every parameter listed by model.checkpoint_slices() from the checkpoint at `path`.

    Returns the vision tower's tensors (name without prefix -> tensor on `device`) when keep_vision.
    Raises CheckpointError naming missing, unexpected or wrongly shaped tensors.
    """
    tensors = list_tensors(path)
    try:
        targets, found, vision = _match(model, tensors)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    for name, full in found.items():
        shape = targets[name][2]
        if tuple(tensors[full].shape) != tuple(shape):
            raise CheckpointError(f"tensor {name} has shape {list(tensors[full].shape)}, config.json implies {list(shape)}")
    reader = TensorReader(str(device) if torch.device(device).type == "cuda" else "cpu")
    todo = list(found.items()) + ([(None, full) for full in vision.values()] if keep_vision else [])
    kept = {}
    with torch.no_grad():
        for done, (name, full) in enumerate(todo, 1):
            t = reader.get(tensors[full])
            if name is None:
                kept[canonical_name(full)[1]] = t.to(device)
            else:
                _copy(*targets[name], t)
            del t
            if progress:
                progress(done, len(todo))
    reader.close()
    return kept


def load_state_dict(model, state: dict[str, torch.Tensor]) -> None:
    """Fill the model from in-memory tensors named as in a checkpoint (e.g. a transformers model's
    state_dict); used to compare against transformers at shapes too big to write to disk."""
    targets, found, _ = _match(model, state)
    with torch.no_grad():
        for name, full in found.items():
            param, row, shape = targets[name]
            if tuple(state[full].shape) != tuple(shape):
                raise CheckpointError(f"tensor {name} has shape {list(state[full].shape)}, expected {list(shape)}")
            _copy(param, row, shape, state[full])

"""Load a checkpoint's tensors into the engine's model, one tensor at a time.

Checkpoint names come in two spellings: `model.language_model.*` (the multimodal `qwen3_5`
wrapper) and `model.*` (text-only). `lm_head.weight`, `mtp.*` and `model.visual.*` sit beside
them. Each tensor is read onto the target device, cast, copied into its (possibly fused)
parameter and dropped, so host and device never hold the checkpoint twice.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable

import torch

from engine.weights.checkpoint import CheckpointError, canonical_name, list_tensors
from engine.weights.experts import expert_slice, per_expert_weights

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


def _copy(target, row, shape, value) -> None:
    if isinstance(target, torch.Tensor):
        target[row:row + shape[0]].copy_(value.reshape(shape[0], *target.shape[1:]))
    else:
        target.load_rows(row, value)   # a Linear: float rows, or a quantized (q, scales[, zeros]) tuple


def load_weights(model, path: str | Path, device, keep_vision: bool = True, policy=None,
                 progress: Callable[[str, int, int], None] | None = None, identity: dict | None = None,
                 cache=None) -> dict[str, torch.Tensor]:
    """Fill every weight listed by model.checkpoint_slices() from the checkpoint at `path`, one
    tensor at a time. Any supported source format (16-bit, FP8 block, GPTQ, AWQ); with a
    quantization `policy` the converted weights come from (or go to) the conversion cache.

    progress(stage, done, total) reports each weight, counted by its size (KiB of elements: the first weights
    are norms of a few KiB, the last MLPs hundreds of MiB, so a count of weights made the time left grow as it
    went); stage says whether weights are being read, converted (a first int4 load) or read back from the
    conversion cache.
    Returns the vision tower's tensors (name without prefix -> tensor on `device`) when keep_vision.
    Raises CheckpointError naming missing, unexpected or wrongly shaped tensors.
    """
    from engine.weights.convert_cache import ConvertCache, cache_key, convert, converted_weights, source_identity
    from engine.weights.formats import WeightSource
    from engine.weights.policy import DEFAULT_POLICY
    reader_device = str(device) if torch.device(device).type == "cuda" else "cpu"
    source = WeightSource(path, reader_device)
    try:
        targets, found, vision = _match(model, source.shapes)
    except CheckpointError as e:
        source.close()
        raise CheckpointError(f"{path}: {e}") from None
    for name, full in found.items():
        shape = targets[name][2]
        if tuple(source.shapes[full]) != tuple(shape):
            source.close()
            raise CheckpointError(f"tensor {name} has shape {list(source.shapes[full])}, "
                                  f"config.json implies {list(shape)}")
    wanted = {full: name for name, full in found.items()}
    if keep_vision:
        wanted.update({full: None for full in vision.values()})
    if policy is None:
        stage = "Loading weights"
        # 16-bit targets: int4 sources (GPTQ / AWQ) are dequantized, FP8 ones already are by the reader
        stream = ((full, convert(source.read(full), "float", DEFAULT_POLICY)) for full in wanted)
    else:
        source.close()
        cache = cache or ConvertCache()
        identity = identity or source_identity(path)
        hit = cache.has(cache_key(identity, policy))
        stage = "Loading int4 weights from the cache" if hit else "Converting weights to int4 (first load)"
        stream = converted_weights(path, policy, reader_device, cache=cache, identity=identity)
    sizes = {full: torch.Size(source.shapes[full]).numel() for full in wanted}
    total, done = sum(sizes.values()), 0
    kept = {}
    try:                                       # progress may raise (a cancelled load): the files close either way
        with torch.no_grad():
            for full, value in stream:
                if full not in wanted:
                    continue
                name = wanted[full]
                if name is None:                # a vision weight: the policy keeps those 16-bit
                    assert isinstance(value, torch.Tensor), f"{full} was quantized"
                    kept[canonical_name(full)[1]] = value.to(device)
                else:
                    target, row, shape = targets[name]
                    _copy(target, row, shape, value)    # converted_weights gave each weight its target's scheme
                del value
                done += sizes[full]
                if progress:
                    progress(stage, done >> 10, total >> 10)
    finally:
        stream.close()
        if policy is None:
            source.close()
    return kept


def load_state_dict(model, state: dict[str, torch.Tensor]) -> None:
    """Fill the model from in-memory tensors named as in a checkpoint (e.g. a transformers model's
    state_dict); used to compare against transformers at shapes too big to write to disk. Fused MoE expert
    tensors are taken per expert (engine/weights/experts.py)."""
    state = dict(state)
    for fused in [n for n in state if per_expert_weights(n, tuple(state[n].shape))]:
        tensor = state.pop(fused)
        for name in per_expert_weights(fused, tuple(tensor.shape)):
            where = expert_slice(name, {fused: tensor})
            assert where is not None                    # per_expert_weights named it
            state[name] = tensor[where.expert, where.rows]
    targets, found, _ = _match(model, state)
    with torch.no_grad():
        for name, full in found.items():
            target, row, shape = targets[name]
            if state[full].shape[0] != shape[0] or state[full].numel() != torch.Size(shape).numel():
                raise CheckpointError(f"tensor {name} has shape {list(state[full].shape)}, expected {list(shape)}")
            _copy(target, row, shape, state[full])

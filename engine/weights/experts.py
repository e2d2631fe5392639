"""MoE expert weights stored fused: the published qwen3_5_moe checkpoints hold each layer's experts as two 3-D
tensors, `...mlp.experts.gate_up_proj` [E, 2I, H] (expert e's gate rows, then its up rows) and
`...mlp.experts.down_proj` [E, H, I]; quantized community releases store them per expert,
`...mlp.experts.{e}.{gate,up,down}_proj.weight`. The engine reads both as the per-expert weights (2-D, so that the
quantization policy and the converters treat each expert like any linear): a fused tensor stands for its E * 3
per-expert names, each read as a slice of it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

_FUSED = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")
_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class ExpertSlice(NamedTuple):
    fused: str            # the 3-D checkpoint tensor
    expert: int
    rows: slice           # of that expert's 2-D matrix


def per_expert_weights(name: str, shape: tuple[int, ...]) -> dict[str, tuple[int, int]]:
    """A fused expert tensor -> its per-expert weight names and shapes; {} for any other tensor."""
    m = _FUSED.match(name)
    if m is None or len(shape) != 3:
        return {}
    base, kind = m.groups()
    E, rows, cols = shape
    if kind == "down_proj":
        return {f"{base}.{e}.down_proj.weight": (rows, cols) for e in range(E)}
    return {f"{base}.{e}.{p}.weight": (rows // 2, cols) for e in range(E) for p in ("gate_proj", "up_proj")}


def expert_slice(name: str, tensors: Mapping) -> ExpertSlice | None:
    """Where per-expert weight `name` lies when the checkpoint (`tensors`: by name, anything with a .shape) stores
    its experts fused."""
    m = _PER_EXPERT.match(name)
    if m is None:
        return None
    base, e, kind = m.group(1), int(m.group(2)), m.group(3)
    fused = f"{base}.{'down_proj' if kind == 'down_proj' else 'gate_up_proj'}"
    if fused not in tensors:
        return None
    half = tensors[fused].shape[1] // 2
    rows = {"gate_proj": slice(0, half), "up_proj": slice(half, 2 * half)}.get(kind, slice(None))
    return ExpertSlice(fused, e, rows)

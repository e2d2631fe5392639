"""The quantization policy: which scheme (int4, int8, or float: not quantized) each checkpoint tensor gets,
and the device bytes a tensor takes under it. Plain rules on names and shapes, so the planner, the model and the
converter all read the same answer without importing each other."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.weights.checkpoint import canonical_name

SCHEMES = ("int4", "int8", "float")   # float: not quantized, kept in the model's dtype (fp32 parameters stay fp32)

_KEEP = re.compile(r"(in_proj_a|in_proj_b)\.weight$")
_TEXT_LINEAR = re.compile(r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|in_proj_qkv|in_proj_z|"
                          r"out_proj|fc)\.weight$")
_VISION_LINEAR = re.compile(r"(attn\.qkv|attn\.proj|linear_fc1|linear_fc2)\.weight$")
_EMBEDDINGS = ("embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class QuantPolicy:
    """Which scheme each checkpoint tensor gets. Only 2-D linear weights whose K is a multiple of the
    group size are quantized; norms, conv1d, A_log, dt_bias and biases always stay as they are."""
    linear: str = "int4"       # text attention q/k/v/o, MLP, GDN in_proj_qkv / in_proj_z / out_proj
    embeddings: str = "int8"   # embed_tokens and lm_head
    mtp: str = "int4"          # the MTP module's projections (fc, attention, MLP)
    vision: str = "float"      # the vision tower's linears
    group_size: int = 128
    method: str = "als"        # int4 method for float sources

    def __post_init__(self):
        for field in ("linear", "embeddings", "mtp", "vision"):
            if getattr(self, field) not in SCHEMES:
                raise ValueError(f"QuantPolicy.{field} must be one of {SCHEMES}, not {getattr(self, field)!r}")

    def scheme(self, name: str, shape: tuple[int, ...]) -> str:
        """The scheme for checkpoint tensor `name` (any spelling: model.language_model.*, model.*, mtp.*,
        model.visual.*) of logical shape `shape`."""
        kind, short = canonical_name(name)
        if len(shape) != 2 or _KEEP.search(short):
            scheme = "float"
        elif short in _EMBEDDINGS:
            scheme = self.embeddings
        elif kind == "vision":
            scheme = self.vision if _VISION_LINEAR.search(short) else "float"
        elif _TEXT_LINEAR.search(short):
            scheme = self.mtp if kind == "mtp" else self.linear
        else:
            scheme = "float"
        return "float" if scheme != "float" and shape[1] % self.group_size else scheme

    def key(self) -> str:
        """Identifies the converted weights this policy produces (part of the conversion cache key)."""
        return (f"linear={self.linear},embeddings={self.embeddings},mtp={self.mtp},vision={self.vision},"
                f"g={self.group_size},method={self.method}")


DEFAULT_POLICY = QuantPolicy()


def int8_held_as_planes(shape: tuple[int, ...]) -> bool:
    """Whether an int8 linear weight [N, K] is held as two int4 planes over 2K (engine/model/linear.py): when each
    half is whole 128-k blocks, as the int4 GEMV reading x twice needs."""
    return len(shape) == 2 and shape[1] % 128 == 0


def scheme_bytes(scheme: str, shape: tuple[int, ...], group_size: int, element_size: int = 2,
                 table: bool = False) -> int:
    """Device bytes of one tensor under `scheme` (fp16/bf16 scales and zeros; int4 packs two per byte, in tiles of
    16 rows x 128 k, its scales and zeros in tiles of 16 rows: a tensor that is not a whole number of them is counted
    with its padding). An int8 linear weight may be held as two int4 planes (int8_held_as_planes); an int8 `table`
    (the embedding, gathered by rows) is int8."""
    n = 1
    for d in shape:
        n *= d
    if scheme == "int8" and not table and int8_held_as_planes(shape):
        return scheme_bytes("int4", (shape[0], 2 * shape[1]), group_size)
    if scheme == "int4":
        rows, k = shape[0], n // shape[0]
        tile_rows = -(-rows // 16) * 16
        return tile_rows * -(-k // 128) * 64 + 2 * 2 * tile_rows * (k // group_size)
    if scheme == "int8":
        return n + 2 * n // group_size
    return n * element_size


def policy_bytes(shapes: dict[str, tuple[tuple, int]], policy: QuantPolicy = DEFAULT_POLICY) -> dict[str, int]:
    """Bytes per scheme (int4, int8, float) and total for tensors listed as by model_tensor_shapes."""
    out = dict.fromkeys(SCHEMES, 0)
    for name, (shape, element_size) in shapes.items():
        scheme = policy.scheme(name, shape)
        table = canonical_name(name)[1] == "embed_tokens.weight"
        out[scheme] += scheme_bytes(scheme, shape, policy.group_size, element_size, table=table)
    out["total"] = sum(out[s] for s in SCHEMES)
    return out

"""Weight-only quantization to the engine's int4 / int8 formats, and the policy saying which tensor gets which.

Canonical forms (what pack_int4 / pack_int8 of kernels/quant_format.py take), groups of G along K (the input dim):
  int4: q uint8 [N, K] in 0..15, scales and zeros [N, K/G], float zero points: W ~ (q - zeros) * scales
  int8: q int8 [N, K], scales [N, K/G], symmetric: W ~ q * scales

int4 methods, neither needs calibration data:
  "rtn": each group's min..max mapped onto 0..15.
  "als": alternating least squares. From a few clipped ranges (including RTN's), alternate assigning levels
         (round to nearest) and refitting the group's scale and zero by least squares; keep, per group, the
         candidate with the smallest error after scales/zeros are rounded to their stored dtype, so it is
         never worse than RTN. (HQQ's robust l_p<1, zero-only update was tried too: on synthetic LLM-like
         weights it gets about a third of this method's error reduction over RTN.)
Large tensors go in chunks of rows, so the temporaries stay a few hundred MB whatever the tensor's size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.weights.checkpoint import canonical_name

CHUNK_ELEMENTS = 1 << 24          # fp32 elements per chunk of rows
ALS_CLIP_RATIOS = (1.0, 0.9, 0.8)  # starting ranges, as fractions of the group's min..max span
ALS_ITERS = 10


class Int4(NamedTuple):
    q: torch.Tensor        # uint8 [N, K], 0..15
    scales: torch.Tensor   # [N, K // G]
    zeros: torch.Tensor    # [N, K // G]

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scales.shape[1]


class Int8(NamedTuple):
    q: torch.Tensor        # int8 [N, K]
    scales: torch.Tensor   # [N, K // G]

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scales.shape[1]


def _groups(W: torch.Tensor, group_size: int):
    """Yield (row slice, fp32 view [rows * K/G, G]) chunk by chunk."""
    N, K = W.shape
    if K % group_size:
        raise ValueError(f"K={K} is not a multiple of the group size {group_size}")
    rows = max(1, CHUNK_ELEMENTS // K)
    for r in range(0, N, rows):
        yield slice(r, min(r + rows, N)), W[r:r + rows].float().reshape(-1, group_size)


def _stored(s, z, floor, dtype):
    """(scale, zero) as they will read back from `dtype`; the scale floor keeps zeros (-min/scale) finite."""
    return s.clamp_min(floor).to(dtype).float(), z.to(dtype).float()


def _levels(w, s, z):
    return torch.round(w / s[:, None] + z[:, None]).clamp_(0, 15)


def _sq_error(w, s, z):
    return ((_levels(w, s, z) - z[:, None]) * s[:, None] - w).square_().sum(1)


def _clipped_start(w, ratio, floor):
    """Scale and zero mapping the group's range, shrunk by `ratio` about its middle, onto 0..15."""
    lo, hi = w.amin(1), w.amax(1)
    mid = (lo + hi) / 2
    lo, hi = mid + (lo - mid) * ratio, mid + (hi - mid) * ratio
    s = ((hi - lo) / 15).clamp_min(floor)
    return s, -lo / s


def _refit(w, s, z, iters):
    """Alternate level assignment and the least-squares (scale, zero) of each group."""
    n = w.shape[1]
    w_sum = w.sum(1)
    for _ in range(iters):
        q = _levels(w, s, z)
        q_sum = q.sum(1)
        var = q.square().sum(1) - q_sum.square() / n
        cov = (q * w).sum(1) - q_sum * w_sum / n
        fit = var > 0          # levels are monotone in w, so cov > 0 whenever var > 0
        a = torch.where(fit, cov / torch.where(fit, var, 1.0), s)
        b = (w_sum - a * q_sum) / n
        s, z = a, torch.where(fit, -b / a, z)
    return s, z


def _quantize_group_rows(w, method, dtype):
    floor = (w.abs().amax(1) / 2048).clamp_min(torch.finfo(dtype).tiny)
    s, z = _stored(*_clipped_start(w, 1.0, floor), floor, dtype)
    if method == "als":
        best = _sq_error(w, s, z)
        for ratio in ALS_CLIP_RATIOS:
            cs, cz = _stored(*_refit(w, *_clipped_start(w, ratio, floor), ALS_ITERS), floor, dtype)
            err = _sq_error(w, cs, cz)
            better = err < best
            best = torch.where(better, err, best)
            s, z = torch.where(better, cs, s), torch.where(better, cz, z)
    return _levels(w, s, z), s, z


def quantize_int4(W: torch.Tensor, group_size: int = 128, method: str = "als",
                  dtype: torch.dtype = torch.float16) -> Int4:
    """W [N, K] float -> Int4 (q, scales, zeros) on W's device; scales and zeros stored in `dtype`."""
    if method not in ("als", "rtn"):
        raise ValueError(f"unknown int4 method {method!r} (als or rtn)")
    N, K = W.shape
    q = torch.empty(N, K, dtype=torch.uint8, device=W.device)
    scales = torch.empty(N, K // group_size, dtype=dtype, device=W.device)
    zeros = torch.empty_like(scales)
    for rows, w in _groups(W, group_size):
        cq, cs, cz = _quantize_group_rows(w, method, dtype)
        q[rows] = cq.to(torch.uint8).view(-1, K)
        scales[rows] = cs.to(dtype).view(-1, K // group_size)
        zeros[rows] = cz.to(dtype).view(-1, K // group_size)
    return Int4(q, scales, zeros)


def quantize_int8(W: torch.Tensor, group_size: int = 128, dtype: torch.dtype = torch.float16) -> Int8:
    """W [N, K] float -> Int8 (q, scales), symmetric per group: scale = absmax / 127."""
    N, K = W.shape
    q = torch.empty(N, K, dtype=torch.int8, device=W.device)
    scales = torch.empty(N, K // group_size, dtype=dtype, device=W.device)
    for rows, w in _groups(W, group_size):
        s = (w.abs().amax(1) / 127).clamp_min(torch.finfo(dtype).tiny).to(dtype).float()
        q[rows] = torch.round(w / s[:, None]).clamp_(-127, 127).to(torch.int8).view(-1, K)
        scales[rows] = s.to(dtype).view(-1, K // group_size)
    return Int8(q, scales)


def dequantize(t: Int4 | Int8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float matrix a quantized weight stands for (reference; test oracle and 16-bit fallback)."""
    G = t.group_size
    scales = t.scales.float().repeat_interleave(G, dim=1)
    if isinstance(t, Int4):
        return ((t.q.float() - t.zeros.float().repeat_interleave(G, dim=1)) * scales).to(dtype)
    return (t.q.float() * scales).to(dtype)


# ---- policy ---------------------------------------------------------------------------------------------

SCHEMES = ("int4", "int8", "bf16")   # bf16: kept in the model's 16-bit dtype (fp32 parameters stay fp32)

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
    vision: str = "bf16"       # the vision tower's linears
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
            scheme = "bf16"
        elif short in _EMBEDDINGS:
            scheme = self.embeddings
        elif kind == "vision":
            scheme = self.vision if _VISION_LINEAR.search(short) else "bf16"
        elif _TEXT_LINEAR.search(short):
            scheme = self.mtp if kind == "mtp" else self.linear
        else:
            scheme = "bf16"
        return "bf16" if scheme != "bf16" and shape[1] % self.group_size else scheme

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


def model_tensor_shapes(cfg, with_mtp: bool = True, with_vision: bool = True) -> dict[str, tuple[tuple, int]]:
    """Checkpoint tensor name -> (shape, element size kept at 16 bits) for a ModelConfig, without allocating:
    the text model is built on the meta device so the shapes are the model's own."""
    from engine.model.qwen3_5 import Qwen3_5Model  # here: the model (and Triton) only when sizes are asked

    model = Qwen3_5Model(cfg, torch.bfloat16, "meta", with_mtp=with_mtp)
    out = {name: (tuple(shape), target.element_size() if isinstance(target, torch.Tensor) else 2)
           for name, target, _, shape in model.checkpoint_slices()}
    if with_vision and cfg.vision is not None:
        out.update({f"model.visual.{n}": (s, 2) for n, s in _vision_shapes(cfg.vision).items()})
    return out


def _vision_shapes(v) -> dict[str, tuple]:
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


def policy_bytes(shapes: dict[str, tuple[tuple, int]], policy: QuantPolicy = DEFAULT_POLICY) -> dict[str, int]:
    """Bytes per scheme (int4, int8, bf16) and total for tensors listed as by model_tensor_shapes."""
    out = dict.fromkeys(SCHEMES, 0)
    for name, (shape, element_size) in shapes.items():
        scheme = policy.scheme(name, shape)
        table = canonical_name(name)[1] == "embed_tokens.weight"
        out[scheme] += scheme_bytes(scheme, shape, policy.group_size, element_size, table=table)
    out["total"] = sum(out[s] for s in SCHEMES)
    return out

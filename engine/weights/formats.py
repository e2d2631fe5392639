"""Readers for quantized checkpoints: each logical weight comes out as a float tensor or an exact int4.

Formats (on-disk conventions as published by their producers):
  fp8_block  Qwen / DeepSeek-V3 "fine-grained FP8": config quantization_config {quant_method: "fp8",
             fmt: "e4m3", weight_block_size: [bn, bk]}; a quantized Linear has `X.weight` float8_e4m3fn [N, K]
             and `X.weight_scale_inv` [ceil(N/bn), ceil(K/bk)]; W = weight * scale_inv of its block.
  gptq       AutoGPTQ / GPTQModel: `X.qweight` int32 [K/8, N] (input k at bits 4*(k%8) of row k//8),
             `X.qzeros` int32 [K/G, N/8] (output n at bits 4*(n%8) of column n//8), `X.scales` [K/G, N],
             `X.g_idx` int32 [K] (group of each input channel); W[n, k] = (q - z) * s of group g_idx[k].
             checkpoint_format "gptq" (v1, the default) stores z - 1, so z = stored nibble + 1 (1..16);
             "gptq_v2" stores z itself.
  awq        AutoAWQ GEMM: `X.qweight` int32 [K, N/8] and `X.qzeros` int32 [K/G, N/8] packed along N with the
             nibble order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column order[i] of each 8), `X.scales`
             [K/G, N]; W = (q - z) * s, no offset.
Fused MoE expert tensors (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) stand for their
per-expert weights (engine/weights/experts.py); in FP8 (as transformers holds them) each has `X_scale_inv` beside it,
[E, blocks of rows, blocks of K], the gate's row blocks then the up's (each half ceil(I / bn) of them, so that the two
never share a block). Qwen's own FP8 MoE releases store their experts one by one, each expert's linears like any
other FP8 linear. GPTQ and AWQ repack into the canonical Int4 exactly. GPTQ act-order (g_idx not k // G) comes out
as an ActOrderInt4: the input channels permuted so each group is contiguous, plus the permutation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from engine.weights.checkpoint import CheckpointError, TensorInfo, TensorReader, list_tensors
from engine.weights.experts import ExpertSlice, expert_slice, per_expert_weights
from engine.weights.quantize import Int4

FLOAT_FORMATS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)   # column c of each 8 sits in nibble AWQ_REVERSE_ORDER[c]
SUPPORTED = "bf16 / fp16 / fp32, Qwen's FP8 (block-quantized), GPTQ int4 or AWQ int4 (GEMM)"
_QUANTIZED_SUFFIXES = (".qweight", ".weight_scale_inv", ".weight_packed", ".quant_state", ".absmax")


class UnsupportedFormatError(CheckpointError):
    pass


class ActOrderInt4(NamedTuple):
    """A GPTQ act-order weight: x @ W^T == x[..., perm] @ dequantize(weight)^T."""
    weight: Int4
    perm: torch.Tensor     # int64 [K]


QUANT_SIDE_FILES = (("quantize_config.json", "gptq"), ("quant_config.json", "awq"))   # AutoGPTQ's, AutoAWQ's


def read_config(path: str | Path) -> dict:
    """config.json, with quantization_config taken from the older side files (quantize_config.json of
    AutoGPTQ, quant_config.json of AutoAWQ) when config.json lacks it."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return with_side_quant_config(config, lambda name: json.loads((path / name).read_text(encoding="utf-8"))
                                  if (path / name).exists() else None)


def with_side_quant_config(config: dict, read: Callable[[str], dict | None]) -> dict:
    """`config` with quantization_config from the first side file `read(name)` finds (None: not there), when it
    has none of its own: on disk (read_config) or on the hub before a download (the app's search)."""
    if not _quant_config(config):
        for fname, default_method in QUANT_SIDE_FILES:
            side = read(fname)
            if side is not None:
                config["quantization_config"] = {"quant_method": default_method, **side}
                break
    return config


def _quant_config(config: dict) -> dict:
    return config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config") or {}


def detect_format(config: dict, names: Iterable[str]) -> str:
    """"bf16" | "fp16" | "fp32" | "fp8_block" | "gptq" | "awq"; UnsupportedFormatError for anything else."""
    qc = _quant_config(config)
    if not qc:
        marked = next((n for n in names if n.endswith(_QUANTIZED_SUFFIXES) or ".quant_state." in n), None)
        if marked:
            raise UnsupportedFormatError(f"the checkpoint holds quantized tensors (e.g. {marked}) but its config.json "
                                         f"has no quantization_config saying how to read them")
        text = config.get("text_config") or {}
        dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("dtype")
                    or config.get("torch_dtype") or "bfloat16")
        if dtype not in FLOAT_FORMATS:
            raise UnsupportedFormatError(f"checkpoint dtype {dtype!r} is not supported; use {SUPPORTED}")
        return FLOAT_FORMATS[dtype]
    method = str(qc.get("quant_method", "")).lower()
    bits = qc.get("bits", qc.get("w_bit"))
    if method == "fp8":
        if str(qc.get("fmt", "e4m3")) != "e4m3" or len(qc.get("weight_block_size") or ()) != 2:
            raise UnsupportedFormatError("only block-quantized FP8 (fmt e4m3 with a 2-D weight_block_size, as in "
                                         "Qwen's -FP8 releases) is supported; this FP8 checkpoint is per-tensor "
                                         "or per-channel")
        return "fp8_block"
    if method == "gptq":
        fmt = qc.get("checkpoint_format", "gptq")
        if bits != 4 or fmt not in ("gptq", "gptq_v2") or qc.get("is_marlin_format"):
            raise UnsupportedFormatError(f"GPTQ checkpoints are supported with 4 bits in the gptq / gptq_v2 "
                                         f"layout; this one has bits={bits}, checkpoint_format={fmt!r}")
        return "gptq"
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm" or not qc.get("zero_point", True):
            raise UnsupportedFormatError(f"AWQ checkpoints are supported as 4-bit GEMM with zero points; this one "
                                         f"has bits={bits}, version={version!r}, zero_point={qc.get('zero_point')}")
        return "awq"
    hint = {"bitsandbytes": " (quantized at load time: point Qwen Desk at the original bf16 checkpoint instead)",
            "compressed-tensors": " (llm-compressor format)"}.get(method, "")
    raise UnsupportedFormatError(f"quantization method {method!r}{hint} is not supported; use {SUPPORTED}")


@dataclass(frozen=True)
class SourceFormat:
    kind: str                          # as detect_format
    block: tuple[int, int] = (0, 0)    # fp8_block: weight_block_size (rows, cols)
    zero_offset: int = 0               # gptq: 1 for the v1 layout (stored zero = zero - 1)

    @classmethod
    def of(cls, config: dict, names: Iterable[str]) -> SourceFormat:
        kind = detect_format(config, names)
        qc = _quant_config(config)
        if kind == "fp8_block":
            return cls(kind, block=tuple(qc["weight_block_size"]))
        if kind == "gptq":
            return cls(kind, zero_offset=0 if qc.get("checkpoint_format") == "gptq_v2" else 1)
        return cls(kind)


def _sibling(name: str, suffix: str) -> str:
    return name.rsplit(".", 1)[0] + suffix


def logical_weights(tensors: dict[str, TensorInfo], fmt: SourceFormat) -> dict[str, tuple[int, ...]]:
    """The weights a checkpoint stands for, by checkpoint name (GPTQ/AWQ `X.qweight` -> `X.weight`), with their
    logical shapes ([N, K] for linears); scale / zero / g_idx side tensors are folded into their weight."""
    out: dict[str, tuple[int, ...]] = {}
    for name, info in tensors.items():
        if fmt.kind in ("gptq", "awq"):
            if name.endswith(".qweight"):
                rows, cols = info.shape
                out[_sibling(name, ".weight")] = (cols, 8 * rows) if fmt.kind == "gptq" else (8 * cols, rows)
                continue
            if name.endswith((".qzeros", ".scales", ".g_idx")) and _sibling(name, ".qweight") in tensors:
                continue
        if fmt.kind == "fp8_block" and name.endswith("_scale_inv") and name.removesuffix("_scale_inv") in tensors:
            continue          # X.weight_scale_inv of X.weight; experts.gate_up_proj_scale_inv of experts.gate_up_proj
        experts = per_expert_weights(name, info.shape)
        if experts and info.dtype not in ("BF16", "F16", "F32") and not (
                fmt.kind == "fp8_block" and name + "_scale_inv" in tensors):
            raise UnsupportedFormatError(f"{name} holds fused experts as {info.dtype}; fused expert tensors are read "
                                         f"in 16 or 32 bits, or in FP8 with their {name}_scale_inv beside them")
        if experts:
            out.update(experts)
        else:
            out[name] = tuple(info.shape)
    return out


def read_weight(tensors: dict[str, TensorInfo], name: str, fmt: SourceFormat,
                reader: TensorReader) -> torch.Tensor | Int4 | ActOrderInt4:
    """One logical weight (a name from logical_weights), reading only its own tensors: a float tensor (as
    stored; dequantized FP8 in bf16), or the exact Int4 / ActOrderInt4 of a GPTQ / AWQ linear."""
    if fmt.kind in ("gptq", "awq") and name.endswith(".weight") and _sibling(name, ".qweight") in tensors:
        return _read_int4(tensors, name, fmt, reader)
    fused = expert_slice(name, tensors)
    if fused is not None:
        weight = reader.get_slice(tensors[fused.fused], fused.expert, fused.rows)
        scale = tensors.get(fused.fused + "_scale_inv")
        if fmt.kind == "fp8_block" and scale is not None:
            return dequantize_fp8_block(weight, _expert_scales(tensors[fused.fused], scale, fused, fmt, reader),
                                        fmt.block, torch.bfloat16)
        return weight
    scale_name = name + "_scale_inv"
    if fmt.kind == "fp8_block" and scale_name in tensors:
        return dequantize_fp8_block(reader.get(tensors[name]), reader.get(tensors[scale_name]), fmt.block,
                                    torch.bfloat16)
    return reader.get(tensors[name])


def _expert_scales(weight: TensorInfo, scale: TensorInfo, where: ExpertSlice, fmt: SourceFormat,
                   reader: TensorReader) -> torch.Tensor:
    """The block scales of one expert's rows of a fused FP8 expert tensor: gate_up's [E, S, K / bk] holds the gate's
    S / 2 row blocks, then the up's."""
    E, rows, K = weight.shape
    bn, bk = fmt.block
    halves = 2 if where.rows != slice(None) else 1
    blocks = -(-rows // halves // bn)
    if tuple(scale.shape) != (E, halves * blocks, -(-K // bk)):
        raise CheckpointError(f"{scale.name} is {list(scale.shape)}; {weight.name} {list(weight.shape)} in blocks of "
                              f"{list(fmt.block)} needs [{E}, {halves * blocks}, {-(-K // bk)}]")
    first = 0 if where.rows.start in (None, 0) else blocks
    return reader.get_slice(scale, where.expert, slice(first, first + blocks))


def _read_int4(tensors, name, fmt, reader):
    parts = {s: tensors.get(_sibling(name, s)) for s in (".qweight", ".qzeros", ".scales", ".g_idx")}
    for suffix in (".qzeros", ".scales"):
        if parts[suffix] is None:
            raise CheckpointError(f"{_sibling(name, '.qweight')} has no {_sibling(name, suffix)} beside it")
    for suffix in (".qweight", ".qzeros"):
        if parts[suffix].dtype != "I32":
            raise UnsupportedFormatError(f"{parts[suffix].name} is {parts[suffix].dtype}; only int32 packing "
                                         f"is supported")
    qweight, qzeros, scales = (reader.get(parts[s]) for s in (".qweight", ".qzeros", ".scales"))
    if fmt.kind == "awq":
        return unpack_awq(qweight, qzeros, scales)
    g_idx = reader.get(parts[".g_idx"]) if parts[".g_idx"] is not None else None
    return unpack_gptq(qweight, qzeros, scales, g_idx, fmt.zero_offset)


def dequantize_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float8 [N, K] * scale_inv [ceil(N/bn), ceil(K/bk)] of each (bn, bk) block -> `dtype` [N, K]."""
    N, K = weight.shape
    bn, bk = block
    if tuple(scale_inv.shape) != (-(-N // bn), -(-K // bk)):
        raise CheckpointError(f"FP8 weight [{N}, {K}] with blocks {list(block)} needs scale_inv "
                              f"[{-(-N // bn)}, {-(-K // bk)}], got {list(scale_inv.shape)}")
    out = weight.to(torch.float32)
    s = scale_inv.float().repeat_interleave(bk, dim=1)[:, :K]        # [ceil(N/bn), K]
    full = N // bn
    out[:full * bn].view(full, bn, K).mul_(s[:full, None, :])
    if full * bn < N:
        out[full * bn:].mul_(s[full])
    return out.to(dtype)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., C] -> uint8 [..., C, 8]: nibble j holds bits 4j..4j+3."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 15).to(torch.uint8)


def unpack_gptq(qweight, qzeros, scales, g_idx=None, zero_offset: int = 1) -> Int4 | ActOrderInt4:
    """GPTQ tensors -> canonical Int4 (exact); ActOrderInt4 when g_idx is not the plain k // G."""
    K, N = 8 * qweight.shape[0], qweight.shape[1]
    groups = scales.shape[0]
    if K % groups or tuple(scales.shape) != (groups, N) or tuple(qzeros.shape) != (groups, N // 8):
        raise CheckpointError(f"GPTQ tensors disagree: qweight {list(qweight.shape)}, qzeros "
                              f"{list(qzeros.shape)}, scales {list(scales.shape)}")
    G = K // groups
    q = _nibbles(qweight).transpose(1, 2).reshape(K, N).T               # row k // 8, nibble k % 8
    zeros = _nibbles(qzeros).reshape(groups, N).T.to(scales.dtype) + zero_offset
    weight = Int4(q.contiguous(), scales.T.contiguous(), zeros.contiguous())
    if g_idx is None:
        return weight
    g_idx = g_idx.long()
    if torch.equal(g_idx, torch.arange(K, device=g_idx.device) // G):
        return weight
    if not torch.equal(torch.bincount(g_idx, minlength=groups), torch.full((groups,), G, device=g_idx.device)):
        raise UnsupportedFormatError(f"GPTQ g_idx does not give every group {G} input channels; cannot repack")
    perm = torch.argsort(g_idx, stable=True)
    return ActOrderInt4(Int4(weight.q[:, perm].contiguous(), weight.scales, weight.zeros), perm)


def unpack_awq(qweight, qzeros, scales) -> Int4:
    """AWQ GEMM tensors -> canonical Int4 (exact)."""
    K, N = qweight.shape[0], 8 * qweight.shape[1]
    groups = scales.shape[0]
    if K % groups or tuple(scales.shape) != (groups, N) or tuple(qzeros.shape) != (groups, N // 8):
        raise CheckpointError(f"AWQ tensors disagree: qweight {list(qweight.shape)}, qzeros "
                              f"{list(qzeros.shape)}, scales {list(scales.shape)}")
    order = list(AWQ_REVERSE_ORDER)
    q = _nibbles(qweight)[..., order].reshape(K, N).T
    zeros = _nibbles(qzeros)[..., order].reshape(groups, N).T.to(scales.dtype)
    return Int4(q.contiguous(), scales.T.contiguous(), zeros.contiguous())


class WeightSource:
    """A checkpoint seen as logical weights: format, names and shapes up front (headers only), then one
    weight at a time on `device` (shards are opened on first use, tensors read one by one)."""

    def __init__(self, path: str | Path, device: str = "cpu"):
        self.path = Path(path)
        self.tensors = list_tensors(self.path)
        self.format = SourceFormat.of(read_config(self.path), self.tensors)
        self.shapes = logical_weights(self.tensors, self.format)
        self.reader = TensorReader(device)

    def read(self, name: str) -> torch.Tensor | Int4 | ActOrderInt4:
        return read_weight(self.tensors, name, self.format, self.reader)

    def close(self):
        self.reader.close()

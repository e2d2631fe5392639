"""Weights that may be stored quantized: Linear (16-bit, int4 or int8) and the token Embedding.

Which scheme a weight gets comes from the quantization policy (engine/weights/policy.py),
asked with the weight's checkpoint name. A Linear can stack several checkpoint tensors by rows
(fused projections); quantization runs along K only, so each part packs independently into
its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.weights.policy import QuantPolicy, int8_held_as_planes
from qwendesk_kernels import ops
from qwendesk_kernels.quant_format import (Int4Weight, Int8Weight, int8_as_int4_planes, pack_int8, weight_rows,
                                  write_group_param_rows, write_int4_rows)


@dataclass(frozen=True)
class Build:
    """How to build the model's weights: dtype and device of the activations, and the policy
    (None: every weight in `dtype`)."""
    dtype: torch.dtype
    device: torch.device | str
    policy: QuantPolicy | None = None

    def scheme(self, name: str, shape: tuple[int, int]) -> str:
        return "float" if self.policy is None else self.policy.scheme(name, shape)

    @property
    def group_size(self) -> int:
        return 128 if self.policy is None else self.policy.group_size

    def empty(self, *shape, dtype=None) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype or self.dtype, device=self.device)


def param(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


class Linear(nn.Module):
    """y = x W^T with W [out, in] stacked from checkpoint tensors `parts` (name suffix -> rows).
    scheme "float": W in the model dtype; "int4": packed codes with per-group scales and zeros;
    "int8": codes with per-group scales, held as two int4 planes over 2K
    (qwendesk_kernels/quant_format.int8_as_int4_planes: exact, and the int4 GEMV reads them faster than an int8 GEMV
    reads int8) where int8_held_as_planes says."""

    int8_planes = True      # the Embedding gathers rows: row-major int8

    def __init__(self, in_features: int, parts: dict[str, int], build: Build, prefix: str):
        super().__init__()
        self.parts = parts
        self.prefix = prefix
        self.shape = (sum(parts.values()), in_features)
        schemes = {build.scheme(f"{prefix}{name}.weight", (rows, in_features)) for name, rows in parts.items()}
        if len(schemes) != 1:
            raise ValueError(f"the fused parts of {prefix}{'|'.join(parts)} need one scheme, got {schemes}")
        self.scheme = schemes.pop()
        self.group_size = build.group_size
        N, K = self.shape
        self.planes = 2 if self.scheme == "int8" and self.int8_planes and int8_held_as_planes(self.shape) else 1
        self.int4_tiles = self.scheme == "int4" or self.planes == 2
        if self.int4_tiles:
            tiles, K = -(-N // 16), K * self.planes     # 16-row tiles: see qwendesk_kernels/quant_format.py
            self.register_buffer("qweight", build.empty(tiles, -(-K // 128), 16, 16, dtype=torch.int32).zero_())
            self.register_buffer("scales", build.empty(tiles, K // self.group_size, 16).zero_())
            self.register_buffer("zeros", build.empty(tiles, K // self.group_size, 16).zero_())
        elif self.scheme == "int8":
            self.register_buffer("qweight", build.empty(N, K, dtype=torch.int8))
            self.register_buffer("scales", build.empty(N, K // self.group_size))
        else:
            self.weight = param(build.empty(N, K))

    def quantized(self) -> Int4Weight | Int8Weight:
        if self.int4_tiles:
            N, K = self.shape
            return Int4Weight(self.qweight, self.scales, self.zeros, self.group_size, (N, K * self.planes),
                              self.planes)
        return Int8Weight(self.qweight, self.scales, self.group_size, self.shape)

    @property
    def held(self) -> torch.Tensor | Int4Weight | Int8Weight:
        """The weight as the kernels take it: the 16-bit tensor, or the quantized one."""
        return self.weight if self.scheme == "float" else self.quantized()

    def forward(self, x):
        return ops.matmul(x, self.held)

    def first_rows(self, x, n: int):
        """x W[:n]^T: only the first n output rows (n a multiple of 16, the int4 row tile), reading only their
        weights: the draft head over the most frequent tokens (engine/spec/rounds.py)."""
        if n >= self.shape[0]:
            return self(x)
        assert n % 16 == 0, "the first rows are taken in whole 16-row tiles"
        return ops.matmul(x, self.rows(0, n))

    def rows(self, start: int, n: int) -> torch.Tensor | Int4Weight | Int8Weight:
        """The weight of output rows [start, start + n), a view (qwendesk_kernels/quant_format.weight_rows)."""
        return weight_rows(self.held, start, n)

    def checkpoint_slices(self, prefix: str | None = None):
        prefix = self.prefix if prefix is None else prefix
        row = 0
        for name, rows in self.parts.items():
            yield f"{prefix}{name}.weight", self, row, (rows, self.shape[1])
            row += rows

    @torch.no_grad()
    def load_rows(self, row: int, value) -> None:
        """Fill rows [row, row + n) from a float tensor or a quantized (q, scales[, zeros]) tuple
        (engine/weights/quantize.Int4 / Int8) of the same scheme."""
        if self.scheme == "float":
            self.weight[row:row + value.shape[0]].copy_(value.reshape(value.shape[0], -1))
            return
        if isinstance(value, torch.Tensor):
            raise ValueError(f"{self.prefix}: a {self.scheme} weight needs a quantized source, got a float tensor")
        q, s = value[0], value[1]
        if q.shape[1] // s.shape[1] != self.group_size:
            raise ValueError(f"{self.prefix}: group size {q.shape[1] // s.shape[1]}, the model uses {self.group_size}")
        if self.planes == 2:                # by row chunks: the planes of a whole LM head would take GBs on the way
            for r in range(0, q.shape[0], 8192):
                self._write_int4_rows(row + r, *int8_as_int4_planes(q[r:r + 8192], s[r:r + 8192]))
        elif self.scheme == "int4":
            self._write_int4_rows(row, q, s, value[2])
        else:
            self.qweight[row:row + q.shape[0]].copy_(pack_int8(q, s, self.group_size).qweight)
            self.scales[row:row + q.shape[0]].copy_(s)

    def _write_int4_rows(self, row: int, q, scales, zeros) -> None:
        write_int4_rows(self.qweight, row, q.to(self.qweight.device))
        write_group_param_rows(self.scales, row, scales)
        write_group_param_rows(self.zeros, row, zeros)

    def dequantized(self) -> torch.Tensor:
        """W [N, K] in the model dtype (a copy when quantized)."""
        if self.scheme == "float":
            return self.weight
        from qwendesk_kernels.quant_format import dequantize_int4_ref, dequantize_int8_ref
        w = self.quantized()
        return dequantize_int4_ref(w) if isinstance(w, Int4Weight) else dequantize_int8_ref(w)


class Embedding(Linear):
    """The token table [vocab, hidden]: looked up by id; also the LM head when embeddings are tied."""

    int8_planes = False

    def __init__(self, vocab: int, hidden: int, build: Build, name: str):
        super().__init__(hidden, {name: vocab}, build, prefix="")
        if self.scheme == "int4":
            raise ValueError("an int4 embedding table is not supported; use int8 or 16-bit")

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.scheme == "int8":
            table = self.quantized()
            assert isinstance(table, Int8Weight)    # an embedding's int8 is never held as planes (int8_planes)
            return ops.int8_embedding(ids, table)
        return self.weight[ids]

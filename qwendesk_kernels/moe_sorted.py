"""The MoE experts in torch: the (token, expert) pairs sorted by expert, one GEMM (or GEMV) per expert that has
tokens, reading only those experts' weights. It learns how many tokens each expert has on the host (a sync): not
capturable in a CUDA graph. The path of int8 experts, and of many tokens until the grouped kernels take them."""

from __future__ import annotations

from typing import TypeAlias

import torch

from qwendesk_kernels.activation import silu_mul
from qwendesk_kernels.quant import int4_swiglu, matmul
from qwendesk_kernels.quant_format import Int4Weight, Int8Weight, weight_rows

Weight: TypeAlias = torch.Tensor | Int4Weight | Int8Weight


def moe_sorted(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: Weight, down: Weight,
               inter: int) -> torch.Tensor:
    """sum over j of weights[t, j] * expert_{ids[t, j]}(x[t]) for x [T, H] (qwendesk_kernels/moe_decode.py: the
    layout)."""
    P = ids.shape[1]
    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)
    tokens = order // P                                                # the token of each sorted pair
    counts = torch.bincount(flat).tolist()                             # the host sync
    xs = x[tokens]
    out = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):
        if n:
            out[start:start + n] = _expert(xs[start:start + n], gate_up, down, inter, e)
            start += n
    out *= weights.flatten()[order, None]
    return torch.zeros_like(x).index_add_(0, tokens, out)


def _expert(x: torch.Tensor, gate_up: Weight, down: Weight, inter: int, e: int) -> torch.Tensor:
    """Expert e's SwiGLU MLP on rows x [n, H]."""
    w = weight_rows(gate_up, 2 * inter * e, 2 * inter)
    h = int4_swiglu(x, w) if isinstance(w, Int4Weight) else silu_mul(matmul(x, w))
    return matmul(h, weight_rows(down, x.shape[1] * e, x.shape[1]))

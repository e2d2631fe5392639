"""The ops the model calls, one name each. Each dispatches on the tensors' device: Triton kernels
on CUDA, the torch references (`*_ref`) elsewhere."""

import torch

from qwendesk_kernels.activation import silu_mul
from qwendesk_kernels.attention import block_attention           # 16-bit / int8 pools: a block drafter's
from qwendesk_kernels.attention_kv4 import paged_attention, store_kv   # bf16 / int8 pools: attention.py
from qwendesk_kernels.conv1d import causal_conv1d
from qwendesk_kernels.gdn import gated_delta_rule, gdn_decode, gdn_gating, gdn_replay
from qwendesk_kernels.moe_decode import MOE_DECODE_MAX_T, moe_decode, moe_decode_ref, moe_decode_supports
from qwendesk_kernels.moe_decode_mma import moe_decode_mma, moe_decode_mma_supports
from qwendesk_kernels.moe_grouped import moe_grouped
from qwendesk_kernels.moe_route import moe_route
from qwendesk_kernels.moe_sorted import moe_sorted
from qwendesk_kernels.norm import add_rms_norm, gated_rms_norm, rms_norm
from qwendesk_kernels.quant import int4_swiglu, int8_embedding, matmul
from qwendesk_kernels.rope import qk_norm_rope


def moe_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up, down, inter: int) -> torch.Tensor:
    """sum over j of weights[t, j] * expert_{ids[t, j]}(x[t]) for x [T, H] (qwendesk_kernels/moe_decode.py: the layout).
    16-bit or int4 experts: the decode kernels up to MOE_DECODE_MAX_T tokens (int4 on the mma GEMV's machinery,
    qwendesk_kernels/moe_decode_mma.py, where it applies: 1.8-2.5x the tl.dot ones at the 35B-A3B shape on the H200),
    the grouped kernels above (prefill, a speculative round's verify rows); none syncs with the host, so all run in CUDA
    graphs; elsewhere than CUDA their references. Int8 experts: the sorted torch loop (a host sync)."""
    if not moe_decode_supports(gate_up, down):
        return moe_sorted(x, ids, weights, gate_up, down, inter)
    if x.shape[0] > MOE_DECODE_MAX_T:
        return moe_grouped(x, ids, weights, gate_up, down, inter)
    if not x.is_cuda:
        return moe_decode_ref(x, ids, weights, gate_up, down, inter)
    if moe_decode_mma_supports(x, gate_up, down, inter):
        return moe_decode_mma(x, ids, weights, gate_up, down, inter)
    return moe_decode(x, ids, weights, gate_up, down, inter)


__all__ = ["add_rms_norm", "block_attention", "causal_conv1d", "gated_delta_rule", "gated_rms_norm", "gdn_decode",
           "gdn_gating", "gdn_replay", "int4_swiglu", "int8_embedding", "matmul", "moe_experts", "moe_route",
           "paged_attention", "qk_norm_rope", "rms_norm", "silu_mul", "store_kv"]

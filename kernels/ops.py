"""The ops the model calls, one name each. Each dispatches on the tensors' device: Triton kernels
on CUDA, the torch references (`*_ref`) elsewhere."""

from kernels.activation import silu_mul
from kernels.attention import paged_attention, store_kv
from kernels.conv1d import causal_conv1d
from kernels.gdn import gated_delta_rule, gdn_decode, gdn_gating, gdn_replay
from kernels.moe_route import moe_route
from kernels.norm import add_rms_norm, gated_rms_norm, rms_norm
from kernels.quant import int4_swiglu, int8_embedding, matmul
from kernels.rope import qk_norm_rope

__all__ = ["add_rms_norm", "causal_conv1d", "gated_delta_rule", "gated_rms_norm", "gdn_decode", "gdn_gating",
           "gdn_replay", "int4_swiglu", "int8_embedding", "matmul", "moe_route", "paged_attention",
           "qk_norm_rope", "rms_norm", "silu_mul", "store_kv"]

"""The ops the model calls, one name each. Each dispatches on the tensors' device: Triton kernels
on CUDA, the torch references (`*_ref`) elsewhere."""

import torch.nn.functional as F

from kernels.activation import silu_mul_ref as silu_mul
from kernels.attention import paged_attention, store_kv
from kernels.conv1d import causal_conv1d
from kernels.gdn import gated_delta_rule, gdn_decode, gdn_gating
from kernels.norm import add_rms_norm_ref as add_rms_norm, gated_rms_norm_ref as gated_rms_norm
from kernels.norm import rms_norm_ref as rms_norm
from kernels.rope import apply_rope_ref as apply_rope

linear = F.linear

__all__ = ["add_rms_norm", "apply_rope", "causal_conv1d", "gated_delta_rule", "gated_rms_norm", "gdn_decode",
           "gdn_gating", "linear", "paged_attention", "rms_norm", "silu_mul", "store_kv"]

"""SwiGLU over a fused gate|up projection."""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwendesk_kernels import pdl


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2n] -> silu(gate) * up, [..., n]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    dtype = out_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + N + cols, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)    # silu is rounded before the product, as in torch
    tl.store(out_ptr + row * N + cols, (s * u).to(dtype), mask=mask)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, 2 * n)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(*gate_up.shape[:-1], n, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(x.shape[0], triton.cdiv(n, block))](x, out, x.stride(0), n, BLOCK=block, num_warps=4,
                                                          **pdl.launch_args(x.device))
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2n] (last dim contiguous, rows may be strided) -> [..., n], same dtype."""
    return silu_mul_triton(gate_up) if gate_up.is_cuda else silu_mul_ref(gate_up)

"""Norms, rotary and SwiGLU kernels against their torch references.

CPU: the Triton kernels run in the interpreter on small odd shapes in fp32 / fp16. GPU: bf16 at the 27B
shapes (hidden 5120; q [T, 24, 256] and k [T, 4, 256] cut out of the fused qkv projection; GDN output
[T, 48, 128] with the gate cut out of in_proj), plus CUDA-graph replay of the decode shapes.
"""

import pytest
import torch

from qwendesk_kernels.activation import silu_mul, silu_mul_ref, silu_mul_triton
from qwendesk_kernels.norm import (add_rms_norm, add_rms_norm_ref, add_rms_norm_triton, gated_rms_norm,
                                   gated_rms_norm_ref, gated_rms_norm_triton, rms_norm, rms_norm_ref, rms_norm_triton)
from qwendesk_kernels.rope import (apply_rope_ref, inv_freq, mrope_axis, qk_norm_rope, qk_rope, qk_rope_triton,
                          rope_cos_sin)

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


pytestmark = pytest.mark.usefixtures("poisoned_outputs")   # see tests/conftest.py


def check(out, ref, dtype, exact_frac=None):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])
    if exact_frac is not None:   # bf16 on the GPU: the same casts as torch, so nearly every element is bit-equal
        assert (out == ref).float().mean() >= exact_frac


def strided_heads(T, H, D, dtype, device, extra=3):
    """A [T, H, D] view of a wider buffer (token stride > H * D), the way q/k come out of the qkv projection."""
    buf = torch.randn(T, H * D + extra, dtype=dtype, device=device)
    return buf, buf[:, extra:].view(T, H, D)


# ---------------------------------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 40), (7, 200), (3, 5, 64), (2, 3, 3, 24)])
def test_rms_norm(shape, dtype):
    x = torch.randn(shape, dtype=dtype) * 3
    w = torch.randn(shape[-1], dtype=dtype) * 0.1
    check(rms_norm_triton(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_strided_heads(dtype):
    _, x = strided_heads(5, 3, 48, dtype, "cpu")
    w = torch.randn(48, dtype=dtype) * 0.1
    assert not x.is_contiguous()
    check(rms_norm_triton(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 40), (9, 300), (2, 3, 64)])
def test_add_rms_norm(shape, dtype):
    x = torch.randn(shape, dtype=dtype)
    res = torch.randn(shape, dtype=dtype) * 4
    w = torch.randn(shape[-1], dtype=dtype) * 0.1
    out, new_res = add_rms_norm_triton(x, res, w, 1e-6)
    ref_out, ref_res = add_rms_norm_ref(x, res, w, 1e-6)
    assert torch.equal(new_res, ref_res)
    check(out, ref_out, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("w_dtype", ["same", torch.float32])
def test_gated_rms_norm(dtype, w_dtype):
    T, H, N = 6, 3, 40
    x = torch.randn(T, H, N, dtype=dtype)
    _, gate = strided_heads(T, H, N, dtype, "cpu", extra=5)
    w = torch.randn(N, dtype=dtype if w_dtype == "same" else w_dtype) + 1
    check(gated_rms_norm_triton(x, gate, w, 1e-6), gated_rms_norm_ref(x, gate, w, 1e-6), dtype)


def mrope_positions(T, device, start=0):
    """Distinct t / h / w positions (as for an image), [3, T] int64."""
    t = torch.arange(start, start + T, device=device)
    return torch.stack([t, t // 3 + 7, (t * 5) % 11 + 2])


def qk_views(T, HQ, HK, D, dtype, device):
    """q [T, HQ, D] interleaved with its gate per head and k [T, HK, D] after it, as the qkv projection lays them
    out."""
    buf = torch.randn(T, 2 * HQ * D + 2 * HK * D, dtype=dtype, device=device) * 2
    q = buf[:, :2 * HQ * D].view(T, HQ, 2 * D)[..., :D]
    k = buf[:, 2 * HQ * D:2 * HQ * D + HK * D].view(T, HK, D)
    return buf, q, k


def rope_refs(q, k, qw, kw, eps, positions, freqs, axis):
    cos, sin = rope_cos_sin(positions, freqs, axis)
    if qw is not None:
        q, k = rms_norm_ref(q, qw, eps), rms_norm_ref(k, kw, eps)
    return apply_rope_ref(q, cos, sin), apply_rope_ref(k, cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("T,HQ,HK,D,rotary,section,start", [
    (5, 6, 1, 48, 16, (3, 3, 2), 0),
    (3, 3, 2, 40, 12, (2, 2, 2), 200_000),     # large positions (large angles)
])
def test_qk_rope(T, HQ, HK, D, rotary, section, start, norm, dtype):
    buf, q, k = qk_views(T, HQ, HK, D, dtype, "cpu")
    before = buf.clone()
    freqs, axis = inv_freq(rotary, 1e7), mrope_axis(rotary, section)
    positions = mrope_positions(T, "cpu", start)
    qw, kw = (torch.randn(D, dtype=dtype) * 0.1, torch.randn(D, dtype=dtype) * 0.1) if norm else (None, None)
    ref_q, ref_k = rope_refs(q, k, qw, kw, 1e-6, positions, freqs, axis)
    qk_rope_triton(q, k, positions, freqs, axis, qw, kw, 1e-6)
    check(q, ref_q, dtype)
    check(k, ref_k, dtype)
    touched = torch.zeros_like(buf, dtype=torch.bool)
    touched[:, :2 * HQ * D].view(T, HQ, 2 * D)[..., :D] = True
    touched[:, 2 * HQ * D:2 * HQ * D + HK * D] = True
    assert torch.equal(buf[~touched], before[~touched])      # gate and v untouched


def test_qk_rope_cpu_dispatch():
    _, q, k = qk_views(4, 2, 1, 32, torch.float32, "cpu")
    freqs, axis = inv_freq(8, 1e7), mrope_axis(8, (2, 1, 1))
    positions = mrope_positions(4, "cpu")
    w = torch.randn(32) * 0.1
    ref_q, ref_k = rope_refs(q, k, w, w, 1e-6, positions, freqs, axis)
    qk_norm_rope(q, k, w, w, 1e-6, positions, freqs, axis)
    assert torch.equal(q, ref_q) and torch.equal(k, ref_k)
    ref_q, ref_k = rope_refs(q, k, None, None, 0.0, positions[0], freqs, axis)
    qk_rope(q, k, positions[0], freqs, axis)
    assert torch.equal(q, ref_q) and torch.equal(k, ref_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2 * 40), (5, 2 * 1500), (2, 3, 2 * 64)])
def test_silu_mul(shape, dtype):
    x = torch.randn(shape, dtype=dtype) * 3
    check(silu_mul_triton(x), silu_mul_ref(x), dtype)


# ---------------------------------------------------------------------------------------------------- GPU

HIDDEN, HQ, HK, HD, ROTARY, SECTION, EPS = 5120, 24, 4, 256, 64, (11, 11, 10), 1e-6
GDN_HV, GDN_DV, FFN = 48, 128, 17408


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 8192])
def test_norms_gpu(T):
    dt, dev = torch.bfloat16, "cuda"
    x = torch.randn(T, HIDDEN, dtype=dt, device=dev)
    res = torch.randn(T, HIDDEN, dtype=dt, device=dev) * 4
    w = torch.randn(HIDDEN, dtype=dt, device=dev) * 0.1
    check(rms_norm(x, w, EPS), rms_norm_ref(x, w, EPS), dt, 0.99)
    out, new_res = add_rms_norm(x, res, w, EPS)
    ref_out, ref_res = add_rms_norm_ref(x, res, w, EPS)
    assert torch.equal(new_res, ref_res)
    check(out, ref_out, dt, 0.99)
    _, q, k = qk_views(T, HQ, HK, HD, dt, dev)
    hw = torch.randn(HD, dtype=dt, device=dev) * 0.1
    check(rms_norm(q, hw, EPS), rms_norm_ref(q, hw, EPS), dt, 0.99)
    check(rms_norm(k, hw, EPS), rms_norm_ref(k, hw, EPS), dt, 0.99)
    o = torch.randn(T, GDN_HV, GDN_DV, dtype=dt, device=dev)
    _, z = strided_heads(T, GDN_HV, GDN_DV, dt, dev, extra=2 * 2048)
    gw = torch.randn(GDN_DV, dtype=dt, device=dev) + 1
    check(gated_rms_norm(o, z, gw, EPS), gated_rms_norm_ref(o, z, gw, EPS), dt, 0.99)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 8192])
@pytest.mark.parametrize("norm", [True, False])
def test_qk_rope_gpu(T, norm):
    dt, dev = torch.bfloat16, "cuda"
    _, q, k = qk_views(T, HQ, HK, HD, dt, dev)
    freqs, axis = inv_freq(ROTARY, 1e7, dev), mrope_axis(ROTARY, SECTION, dev)
    positions = mrope_positions(T, dev, start=100)
    qw, kw = (torch.randn(HD, dtype=dt, device=dev) * 0.1, torch.randn(HD, dtype=dt, device=dev) * 0.1)
    if not norm:
        qw = kw = None
    ref_q, ref_k = rope_refs(q, k, qw, kw, EPS, positions, freqs, axis)
    if norm:
        qk_norm_rope(q, k, qw, kw, EPS, positions, freqs, axis)
    else:
        qk_rope(q, k, positions, freqs, axis)
    # the kernel rotates in fp32, the reference with cos/sin rounded to bf16 first (as transformers
    # does): a rare element lands one bf16 step (0.0156 at magnitude ~3) apart
    for out, ref in ((q, ref_q), (k, ref_k)):
        torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=2e-2)
        assert (out == ref).float().mean() >= 0.99


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 8192])
def test_silu_mul_gpu(T):
    x = torch.randn(T, 2 * FFN, dtype=torch.bfloat16, device="cuda") * 3
    check(silu_mul(x), silu_mul_ref(x), torch.bfloat16, 0.99)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
def test_decode_graph_replay(T):
    """Every decode-path kernel captured in one CUDA graph and replayed on new inputs matches eager."""
    dt, dev = torch.bfloat16, "cuda"
    x = torch.randn(T, HIDDEN, dtype=dt, device=dev)
    res = torch.randn(T, HIDDEN, dtype=dt, device=dev)
    w = torch.randn(HIDDEN, dtype=dt, device=dev) * 0.1
    buf, q, k = qk_views(T, HQ, HK, HD, dt, dev)
    hw = torch.randn(HD, dtype=dt, device=dev) * 0.1
    freqs, axis = inv_freq(ROTARY, 1e7, dev), mrope_axis(ROTARY, SECTION, dev)
    positions = mrope_positions(T, dev, start=5000)
    o = torch.randn(T, GDN_HV, GDN_DV, dtype=dt, device=dev)
    _, z = strided_heads(T, GDN_HV, GDN_DV, dt, dev)
    gw = torch.randn(GDN_DV, dtype=dt, device=dev) + 1
    gate_up = torch.randn(T, 2 * FFN, dtype=dt, device=dev)
    qkv = buf.clone()

    def step():
        buf.copy_(qkv)
        qk_norm_rope(q, k, hw, hw, EPS, positions, freqs, axis)
        return (rms_norm(x, w, EPS), *add_rms_norm(x, res, w, EPS), gated_rms_norm(o, z, gw, EPS),
                silu_mul(gate_up), buf.clone())

    step()                                       # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for t in (x, res, o, z, gate_up, qkv):
        t.copy_(torch.randn_like(t))
    positions.add_(17)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, step()):
        assert torch.equal(got, want)

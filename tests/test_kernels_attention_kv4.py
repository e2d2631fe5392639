"""4-bit KV attention (qwendesk_kernels/attention_kv4.py: k8v4 and k4v4 pools) against its torch references.

Small shapes run the Triton kernels in the interpreter on the CPU; the `gpu` tests repeat them at the 27B shapes
and replay decode in a CUDA graph. Scale pools are poisoned (NaN) wherever nothing was stored and block tables are
padded with a poisoned page, so a read past a sequence's keys shows up as NaN.
"""

import pytest
import torch

from qwendesk_kernels import attention_kv4 as kv4
from qwendesk_kernels.attention import paged_attention_ref
from tests.test_kernels_attention import shuffled_tables, slots_of

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def empty_pools4(num_pages, page, hkv, d, group, k4, device=DEVICE):
    """(k, v, k_scale, v_scale) of a k8v4 (k4=False) or k4v4 layer, scales poisoned."""
    v = torch.full((num_pages, page, hkv, d // 2), 0x88, dtype=torch.uint8, device=device)
    vs = torch.full((num_pages, page, hkv, d // group), float("nan"), dtype=torch.float16, device=device)
    if k4:
        return v.clone(), v, vs.clone(), vs
    k = torch.zeros((num_pages, page, hkv, d), dtype=torch.int8, device=device)
    ks = torch.full((num_pages, page, hkv), float("nan"), dtype=torch.float32, device=device)
    return k, v, ks, vs


def paged_kv4(lens, page, hkv, d, group, k4, seed=0, device=DEVICE):
    """Random K/V (rotated basis) for sequences of `lens` tokens, stored by the reference into shuffled pages;
    also the same K/V in fp32 pools, for the error against full precision."""
    g = torch.Generator().manual_seed(seed)
    tables, num_pages = shuffled_tables(lens, page, g)
    slots = slots_of(tables, page, [(0, n) for n in lens])
    k = torch.randn(len(slots), hkv, d, generator=g)
    v = torch.randn(len(slots), hkv, d, generator=g)
    pools = empty_pools4(num_pages, page, hkv, d, group, k4, device)
    kv4.store_kv4_ref(k.to(device), v.to(device), *pools[:2], slots.to(device), *pools[2:])
    full = [torch.zeros(num_pages, page, hkv, d, device=device) for _ in range(2)]
    full[0].view(-1, hkv, d)[slots] = k.to(device)
    full[1].view(-1, hkv, d)[slots] = v.to(device)
    return pools, full, tables.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def queries(n, hq, d, seed=1, dtype=torch.float32):
    return torch.randn(n, hq, d, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def test_hadamard_is_orthogonal_and_its_own_inverse():
    h = kv4.hadamard(64, "cpu")
    torch.testing.assert_close(h @ h, torch.eye(64), atol=1e-6, rtol=0)
    x = torch.randn(3, 5, 64)
    torch.testing.assert_close(kv4.rotate(kv4.rotate(x)), x, atol=1e-5, rtol=0)


@pytest.mark.parametrize("group", [8, 16, 32])
def test_int4_roundtrip_within_half_a_step(group):
    x = torch.randn(7, 3, 64) * torch.linspace(0.1, 5, 64)
    packed, scale = kv4.quantize_int4_ref(x, group)
    assert packed.shape == (7, 3, 32) and scale.shape == (7, 3, 64 // group)
    err = (kv4.dequantize_int4_ref(packed, scale) - x).abs().unflatten(-1, (64 // group, group))
    assert (err <= scale.float()[..., None] * 0.5 + 1e-3).all()
    zero_p, zero_s = kv4.quantize_int4_ref(torch.zeros(2, 64), group)
    assert (zero_p == 0x88).all() and (zero_s == 0).all()


@pytest.mark.parametrize("k4", [False, True])
def test_store_kv4_matches_ref(k4):
    g = torch.Generator().manual_seed(0)
    page, hkv, d, group, T = 16, 3, 32, 8, 12
    slots = torch.randperm(5 * page, generator=g)[:T]
    slots[[2, 7]] = -1                                                    # padding rows
    k = torch.randn(T, hkv, 2 * d, generator=g)[:, :, :d]                  # strided rows, like a split view
    v = torch.randn(T, hkv, d, generator=g) * 3
    got = empty_pools4(5, page, hkv, d, group, k4)
    want = [t.clone() for t in got]
    kv4.store_kv4_ref(k, v, *want[:2], slots, *want[2:])
    kv4.store_kv4_triton(k.to(DEVICE), v.to(DEVICE), *got[:2], slots.to(DEVICE), *got[2:])
    for a, b in zip(got[2:], want[2:]):                                    # scales: equal, NaN where nothing went
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    for a, b in zip(got[:2], want[:2]):                                    # codes: equal up to a rounded half
        if a.dtype == torch.uint8:
            a, b = torch.cat([a & 15, a >> 4], -1), torch.cat([b & 15, b >> 4], -1)
        diff = (a.int() - b.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


@pytest.mark.parametrize("k4", [False, True])
@pytest.mark.parametrize("hq,hkv,L", [(2, 2, 1), (6, 2, 1), (4, 1, 4), (6, 1, 16)])   # 16 x 6: two row tiles
def test_decode4_matches_ref(k4, hq, hkv, L):
    d, group, page = 32, 8, 16
    lens = [37, max(5, L), 64]
    pools, _, tables, seq_lens = paged_kv4(lens, page, hkv, d, group, k4)
    q = queries(len(lens) * L, hq, d)
    cu = torch.arange(0, len(lens) * L + 1, L, dtype=torch.int32, device=DEVICE)
    want = kv4.paged_attention4_ref(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, *pools[2:])
    got = kv4.decode_attention4(q, *pools[:2], tables, seq_lens, d ** -0.5, L, 3, *pools[2:])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("k4", [False, True])
def test_prefill4_matches_ref_with_cached_prefixes(k4):
    d, group, page, hq, hkv = 32, 16, 16, 4, 2
    chunks = [(0, 21), (40, 9), (16, 16)]                                 # (cached tokens, new tokens)
    pools, _, tables, seq_lens = paged_kv4([c + n for c, n in chunks], page, hkv, d, group, k4)
    q = queries(sum(n for _, n in chunks), hq, d)
    cu = torch.tensor([0] + [n for _, n in chunks]).cumsum(0).to(torch.int32).to(DEVICE)
    want = kv4.paged_attention4_ref(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, *pools[2:])
    got = kv4.prefill_attention4(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, *pools[2:])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("k4", [False, True])
def test_rotated_4bit_kv_close_to_full_precision(k4):
    """Through the dispatch (rotate q, store rotated K/V, rotate o back, gate): near fp32 attention over the
    unrotated K/V; int4 steps are ~1/7 of a group's absmax, so the output error is a few percent of its size."""
    d, hq, hkv, page = 64, 4, 2, 16
    g = torch.Generator().manual_seed(3)
    n = 50
    k, v = torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
    q, gate = torch.randn(n, hq, d, generator=g), torch.randn(n, hq, d, generator=g)
    tables = torch.arange(4, dtype=torch.int32)[None]
    slots, seq_lens, cu = torch.arange(n), torch.tensor([n], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32)
    pools = empty_pools4(4, page, hkv, d, 16, k4, "cpu")
    kv4.store_kv(k, v, *pools[:2], slots, k_scale=pools[2], v_scale=pools[3])
    got = kv4.paged_attention(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, k_scale=pools[2], v_scale=pools[3],
                              gate=gate)
    full = [torch.zeros(4, page, hkv, d) for _ in range(2)]
    full[0].view(-1, hkv, d)[:n], full[1].view(-1, hkv, d)[:n] = k, v
    want = paged_attention_ref(q, *full, tables, cu, seq_lens, d ** -0.5, gate=gate)
    rel = (got - want).norm() / want.norm()
    assert rel < (0.15 if k4 else 0.1), rel


def test_non_4bit_pools_go_to_attention_py():
    q, k = torch.randn(3, 2, 32), torch.randn(3, 1, 32)
    kc, vc = torch.zeros(1, 16, 1, 32), torch.zeros(1, 16, 1, 32)
    kv4.store_kv(k, k, kc, vc, torch.arange(3))
    assert torch.equal(kc[0, :3], k)                                      # stored as given: no rotation
    args = (q, kc, vc, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32), 0.2)
    torch.testing.assert_close(kv4.paged_attention(*args), paged_attention_ref(*args))


# --- GPU: the 27B shapes (Hq 24, Hkv 4, D 256, page 64) in bf16 ------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("k4", [False, True])
@pytest.mark.parametrize("L", [1, 4, 16])     # 16: two row tiles
def test_gpu_decode4_27b_and_graph_replay(k4, L):
    d, group, page, hq, hkv = 256, 32, 64, 24, 4
    lens = [3000, 17, 700]
    pools, _, tables, seq_lens = paged_kv4(lens, page, hkv, d, group, k4)
    q = queries(len(lens) * L, hq, d, dtype=torch.bfloat16)
    cu = torch.arange(0, len(lens) * L + 1, L, dtype=torch.int32, device=DEVICE)
    want = kv4.paged_attention4_ref(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, *pools[2:])
    got = kv4.decode_attention4(q, *pools[:2], tables, seq_lens, d ** -0.5, L, 8, *pools[2:])
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kv4.decode_attention4(q, *pools[:2], tables, seq_lens, d ** -0.5, L, 8, *pools[2:])
    seq_lens.sub_(L)                                                      # shorter contexts, same graph
    graph.replay()
    cu = torch.arange(0, len(lens) * L + 1, L, dtype=torch.int32, device=DEVICE)
    want = kv4.paged_attention4_ref(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, *pools[2:])
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("k4", [False, True])
def test_gpu_prefill4_and_store_27b(k4):
    d, group, page, hq, hkv = 256, 32, 64, 24, 4
    chunks = [(0, 700), (1000, 300)]
    pools, _, tables, seq_lens = paged_kv4([c + n for c, n in chunks], page, hkv, d, group, k4)
    q = queries(sum(n for _, n in chunks), hq, d, dtype=torch.bfloat16)
    cu = torch.tensor([0] + [n for _, n in chunks]).cumsum(0).to(torch.int32).to(DEVICE)
    want = kv4.paged_attention4_ref(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, *pools[2:])
    got = kv4.prefill_attention4(q, *pools[:2], tables, cu, seq_lens, d ** -0.5, *pools[2:])
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    k = torch.randn(500, hkv, d, device=DEVICE, dtype=torch.bfloat16)
    slots = torch.randperm(pools[0].shape[0] * page, device=DEVICE)[:500]
    a, b = [t.clone() for t in pools], [t.clone() for t in pools]
    kv4.store_kv4_triton(k, k, *a[:2], slots, *a[2:])
    kv4.store_kv4_ref(k, k, *b[:2], slots, *b[2:])
    torch.testing.assert_close(a[3], b[3], rtol=0, atol=0, equal_nan=True)

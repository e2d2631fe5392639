"""Paged attention kernels (qwendesk_kernels/attention.py) against their torch references.

Small shapes run the Triton kernels on whatever device there is (the interpreter on the CPU); the
`gpu` tests repeat the checks in bf16 / int8 at the 27B shapes and replay decode in a CUDA graph.
Pools are poisoned (NaN, or -128 with NaN scales for int8) wherever nothing was stored, and block
tables are padded with a poisoned page, so a read past a sequence's keys shows up as NaN.
"""

from dataclasses import dataclass

import pytest
import torch

from qwendesk_kernels.attention import (decode_attention, paged_attention, paged_attention_ref, prefill_attention,
                               store_kv, store_kv_ref, store_kv_triton)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INT8_POISON = -128      # never produced by the symmetric quantiser (range -127..127)


@dataclass
class Paged:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    block_tables: torch.Tensor      # [N, width] int32, shuffled page ids, padded with the poison page
    seq_lens: torch.Tensor          # [N] int32

    @property
    def scales(self):
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}


def empty_pools(num_pages, page, hkv, d, dtype, quant, device=DEVICE, scale_dtype=torch.float32):
    if quant:
        k = torch.full((num_pages, page, hkv, d), INT8_POISON, dtype=torch.int8, device=device)
        ks = torch.full((num_pages, page, hkv), float("nan"), dtype=scale_dtype, device=device)
        return k, k.clone(), ks, ks.clone()
    k = torch.full((num_pages, page, hkv, d), float("nan"), dtype=dtype, device=device)
    return k, k.clone(), None, None


def slots_of(tables, page, ranges):
    """Flat slots of token positions [start, end) of each sequence."""
    return torch.tensor([int(tables[i, t // page]) * page + t % page
                         for i, (a, b) in enumerate(ranges) for t in range(a, b)], dtype=torch.int64)


def shuffled_tables(lens, page, g):
    """(block tables [sequences, pages + 2], pages in all) for sequences of `lens` tokens on shuffled pages, each
    table padded with a spare page."""
    counts = [-(-n // page) for n in lens]
    num_pages = sum(counts) + 1
    ids = torch.randperm(num_pages, generator=g)
    tables = torch.full((len(lens), max(counts) + 2), int(ids[-1]), dtype=torch.int32)
    start = 0
    for i, c in enumerate(counts):
        tables[i, :c] = ids[start:start + c]
        start += c
    return tables, num_pages


def paged_kv(lens, page, hkv, d, dtype=torch.float32, quant=False, seed=0, device=DEVICE):
    """Random K/V for sequences of `lens` tokens, written by the reference store into shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    tables, num_pages = shuffled_tables(lens, page, g)
    slots = slots_of(tables, page, [(0, n) for n in lens])
    k = torch.randn(len(slots), hkv, d, generator=g).to(dtype)
    v = torch.randn(len(slots), hkv, d, generator=g).to(dtype)
    kc, vc, ks, vs = empty_pools(num_pages, page, hkv, d, dtype, quant, device)
    store_kv_ref(k.to(device), v.to(device), kc, vc, slots.to(device), k_scale=ks, v_scale=vs)
    return Paged(kc, vc, ks, vs, tables.to(device), torch.tensor(lens, dtype=torch.int32, device=device))


def decode_inputs(lens, L, hq, hkv, d, page, dtype=torch.float32, quant=False, seed=0, device=DEVICE):
    kv = paged_kv(lens, page, hkv, d, dtype, quant, seed, device)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens) * L, hq, d, generator=g).to(dtype).to(device)
    cu = torch.arange(0, len(lens) * L + 1, L, dtype=torch.int32, device=device)
    return q, cu, kv


def prefill_inputs(chunks, hq, hkv, d, page, dtype=torch.float32, quant=False, seed=0, device=DEVICE):
    """chunks: (cached, new) per sequence; every key, the chunk's own included, is already stored."""
    kv = paged_kv([c + n for c, n in chunks], page, hkv, d, dtype, quant, seed, device)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(n for _, n in chunks), hq, d, generator=g).to(dtype).to(device)
    cu = torch.tensor([0] + [n for _, n in chunks], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    return q, cu, kv


def ref(q, cu, kv, scale):
    return paged_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, scale, **kv.scales)


def q_and_gate(q, seed=5):
    """q and an output gate cut out of one [T, Hq, 2D] buffer, the way the attention layer splits q_proj."""
    gate = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device, q.dtype)
    return torch.cat([q, gate], dim=-1).chunk(2, dim=-1)


def tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-3, "rtol": 1e-2}


# --- store_kv ------------------------------------------------------------------------------------

def store_case(dtype, quant, page=16, hkv=2, d=32, seed=0, scale_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    num_pages, T = 5, 12
    slots = torch.randperm(num_pages * page, generator=g)[:T]
    slots[[2, 7, 8]] = -1                                   # padding rows
    k = torch.randn(T, hkv, 2 * d, generator=g).to(dtype)[:, :, :d]     # strided rows, like a split view
    v = torch.randn(T, hkv, d, generator=g).to(dtype)
    return [x.to(DEVICE) for x in (k, v, slots)], empty_pools(num_pages, page, hkv, d, dtype, quant,
                                                              scale_dtype=scale_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_kv_float(dtype):
    (k, v, slots), (kc, vc, _, _) = store_case(dtype, quant=False)
    kr, vr = kc.clone(), vc.clone()
    store_kv_ref(k, v, kr, vr, slots)
    store_kv_triton(k, v, kc, vc, slots)
    torch.testing.assert_close(kc, kr, rtol=0, atol=0, equal_nan=True)   # padding rows left nothing behind
    torch.testing.assert_close(vc, vr, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_store_kv_int8(scale_dtype):
    (k, v, slots), (kc, vc, ks, vs) = store_case(torch.float32, quant=True, hkv=3, scale_dtype=scale_dtype)
    kr, vr, ksr, vsr = kc.clone(), vc.clone(), ks.clone(), vs.clone()
    store_kv_ref(k, v, kr, vr, slots, k_scale=ksr, v_scale=vsr)
    store_kv_triton(k, v, kc, vc, slots, k_scale=ks, v_scale=vs)
    for got, want in ((kc, kr), (vc, vr)):
        assert ((got == INT8_POISON) == (want == INT8_POISON)).all()
        assert (got.int() - want.int()).abs().max() <= 1       # rounding of exact halves may differ
    torch.testing.assert_close(ks, ksr, rtol=1e-3, atol=0, equal_nan=True)
    torch.testing.assert_close(vs, vsr, rtol=1e-3, atol=0, equal_nan=True)
    written = slots[slots >= 0]
    page = kc.shape[1]
    scale = ks[written // page, written % page, :, None].float()
    deq = kc[written // page, written % page].float() * scale
    assert ((deq - k[slots >= 0]).abs() <= 0.51 * scale).all()


# --- decode --------------------------------------------------------------------------------------

@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 32), (3, 1, 64), (6, 1, 32)])   # GQA ratios 1, 3, 6
@pytest.mark.parametrize("L", [1, 4])
def test_decode_matches_ref(hq, hkv, d, L):
    lens = [L, 37, 150, 32]      # shortest possible, partial last page, long, exact pages
    q, cu, kv = decode_inputs(lens, L, hq, hkv, d, page=16)
    want = ref(q, cu, kv, d ** -0.5)
    for splits in (1, 5):
        got = decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, d ** -0.5, L, splits)
        torch.testing.assert_close(got, want, **tol(q.dtype))


@pytest.mark.parametrize("dtype,page", [(torch.float16, 16), (torch.float32, 32)])
def test_decode_dtypes_and_pages(dtype, page):
    lens = [3, 100, 64, 1]
    q, cu, kv = decode_inputs(lens, 1, 4, 2, 32, page, dtype)
    got = decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.2, 1, 3)
    torch.testing.assert_close(got, ref(q, cu, kv, 0.2), **tol(dtype))


def test_decode_many_empty_splits_and_empty_sequences():
    """More splits than key blocks, and a length-0 sequence (a CUDA-graph padding row) that yields 0."""
    lens = [1, 40, 0]
    q, cu, kv = decode_inputs(lens, 1, 2, 1, 32, page=16)
    got = decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.2, 1, 16)
    torch.testing.assert_close(got, ref(q, cu, kv, 0.2), **tol(q.dtype))
    assert (got[2] == 0).all()


@pytest.mark.parametrize("L", [1, 4])
def test_decode_int8_matches_ref(L):
    lens = [L, 37, 150]
    q, cu, kv = decode_inputs(lens, L, 6, 2, 32, page=16, quant=True)
    got = decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 32 ** -0.5, L, 3, **kv.scales)
    torch.testing.assert_close(got, ref(q, cu, kv, 32 ** -0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("L", [1, 4])
def test_decode_gated_on_strided_q(L):
    """q and gate as views of one buffer (no copies): o * sigmoid(gate) in the combine step."""
    q, cu, kv = decode_inputs([L, 37, 150], L, 6, 2, 32, page=16)
    q, gate = q_and_gate(q)
    want = ref(q, cu, kv, 0.2) * torch.sigmoid(gate)
    torch.testing.assert_close(paged_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, 0.2,
                                                   gate=gate), want)
    got = decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 0.2, L, 3, gate=gate)
    torch.testing.assert_close(got, want, **tol(q.dtype))


# --- prefill -------------------------------------------------------------------------------------

CHUNKS = [(0, 37), (20, 17), (149, 1), (3, 29)]   # fresh, chunk on cache, one row on a long cache, small


@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 32), (3, 1, 64), (6, 1, 32)])
def test_prefill_matches_ref(hq, hkv, d):
    q, cu, kv = prefill_inputs(CHUNKS, hq, hkv, d, page=16)
    got = prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, d ** -0.5)
    torch.testing.assert_close(got, ref(q, cu, kv, d ** -0.5), **tol(q.dtype))


@pytest.mark.parametrize("dtype,page", [(torch.float16, 16), (torch.float32, 32)])
def test_prefill_dtypes_and_pages(dtype, page):
    q, cu, kv = prefill_inputs([(0, 45), (70, 20)], 4, 2, 32, page, dtype)
    got = prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, 0.2)
    torch.testing.assert_close(got, ref(q, cu, kv, 0.2), **tol(dtype))


def test_prefill_int8_matches_ref():
    q, cu, kv = prefill_inputs(CHUNKS, 6, 2, 32, page=16, quant=True)
    got = prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, 32 ** -0.5, **kv.scales)
    torch.testing.assert_close(got, ref(q, cu, kv, 32 ** -0.5), atol=1e-5, rtol=1e-5)


def test_prefill_gated_on_strided_q():
    q, cu, kv = prefill_inputs(CHUNKS, 6, 2, 32, page=16, dtype=torch.float16)
    q, gate = q_and_gate(q)
    got = prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, 0.2, gate=gate)
    torch.testing.assert_close(got, ref(q, cu, kv, 0.2) * torch.sigmoid(gate), **tol(q.dtype))


# --- int8 accuracy and CPU dispatch ---------------------------------------------------------------

def test_int8_kv_error_vs_full_precision():
    """Measured on randn q/k/v (scores ~ N(0, 1)): max |o_int8 - o_fp32| ~0.011-0.014, mean ~0.002 for
    head_dim 32..256; the bound asserted leaves 2x headroom."""
    chunks = [(0, 20), (100, 5), (300, 1)]
    q, cu, full = prefill_inputs(chunks, 6, 2, 64, page=16, device="cpu")
    _, _, quant = prefill_inputs(chunks, 6, 2, 64, page=16, quant=True, device="cpu")
    err = (ref(q, cu, quant, 0.125) - ref(q, cu, full, 0.125)).abs()
    assert err.max() < 0.03 and err.mean() < 0.005


def test_dispatch_on_cpu_uses_reference():
    q, cu, kv = decode_inputs([5, 20], 1, 4, 2, 32, page=16, device="cpu")
    got = paged_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, 0.2,
                          decode_q_len=1, max_seq_len=64)
    torch.testing.assert_close(got, ref(q, cu, kv, 0.2), rtol=0, atol=0)
    (k, v, slots), (kc, vc, _, _) = store_case(torch.float32, quant=False)
    k, v, slots, kc, vc = (x.cpu() for x in (k, v, slots, kc, vc))
    kr, vr = kc.clone(), vc.clone()
    store_kv(k, v, kc, vc, slots)
    store_kv_ref(k, v, kr, vr, slots)
    torch.testing.assert_close(kc, kr, rtol=0, atol=0, equal_nan=True)


# --- GPU: 27B shapes (Hq 24, Hkv 4, head_dim 256, page 64), bf16 and int8 ---------------------------

HQ, HKV, D, PAGE = 24, 4, 256, 64
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.gpu
@pytest.mark.parametrize("quant", [False, True])
def test_gpu_store_kv_27b(quant):
    g = torch.Generator().manual_seed(0)
    T, num_pages = 300, 16
    slots = torch.randperm(num_pages * PAGE, generator=g)[:T]
    slots[::7] = -1
    k = torch.randn(T, HKV, D, generator=g).bfloat16().cuda()
    v = torch.randn(T, HKV, D, generator=g).bfloat16().cuda()
    slots = slots.cuda()
    kc, vc, ks, vs = empty_pools(num_pages, PAGE, HKV, D, torch.bfloat16, quant)
    kr, vr = kc.clone(), vc.clone()
    ksr, vsr = (ks.clone(), vs.clone()) if quant else (None, None)
    store_kv(k, v, kc, vc, slots, k_scale=ks, v_scale=vs)
    store_kv_ref(k, v, kr, vr, slots, k_scale=ksr, v_scale=vsr)
    if quant:
        assert (kc.int() - kr.int()).abs().max() <= 1 and (vc.int() - vr.int()).abs().max() <= 1
        torch.testing.assert_close(ks, ksr, rtol=1e-6, atol=0, equal_nan=True)
        torch.testing.assert_close(vs, vsr, rtol=1e-6, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(kc, kr, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(vc, vr, rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("L", [1, 4])
def test_gpu_decode_27b(L, quant, gated):
    lens = [L, 777, 4097, 32768, 65, 20000, 8, 1000]
    q, cu, kv = decode_inputs(lens, L, HQ, HKV, D, PAGE, torch.bfloat16, quant)
    q, gate = q_and_gate(q) if gated else (q, None)
    got = paged_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, D ** -0.5,
                          decode_q_len=L, max_seq_len=32768, gate=gate, **kv.scales)
    assert got.dtype == torch.bfloat16
    want = paged_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, D ** -0.5, gate=gate,
                               **kv.scales)
    torch.testing.assert_close(got, want, **BF16_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("quant", [False, True])
def test_gpu_prefill_27b(quant, gated):
    chunks = [(6144, 2048), (0, 1000), (50, 1), (100, 300), (0, 8192)]
    q, cu, kv = prefill_inputs(chunks, HQ, HKV, D, PAGE, torch.bfloat16, quant)
    q, gate = q_and_gate(q) if gated else (q, None)
    got = paged_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, D ** -0.5, gate=gate,
                          **kv.scales)
    want = paged_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, D ** -0.5, gate=gate,
                               **kv.scales)
    torch.testing.assert_close(got, want, **BF16_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("L", [1, 4, 16])     # 16 rows x the 27B's 6 heads: two row tiles
def test_gpu_decode_graph_replay(L, quant):
    """store_kv + decode captured once, replayed with new rows, slots and lengths == the eager calls."""
    max_len = [32768, 5000, 300, 64]
    q, cu, kv = decode_inputs(max_len, L, HQ, HKV, D, PAGE, torch.bfloat16, quant)
    new_k = torch.zeros(len(max_len) * L, HKV, D, dtype=torch.bfloat16, device="cuda")
    new_v = torch.zeros_like(new_k)
    slots = torch.full((len(max_len) * L,), -1, dtype=torch.int64, device="cuda")
    seq_lens = kv.seq_lens.clone()

    def step(k_cache, v_cache, k_scale, v_scale):
        store_kv(new_k, new_v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
        return paged_attention(q, k_cache, v_cache, kv.block_tables, cu, seq_lens, D ** -0.5,
                               k_scale=k_scale, v_scale=v_scale, decode_q_len=L, max_seq_len=32768)

    pools = (kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*pools)                                    # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*pools)

    g = torch.Generator().manual_seed(7)
    for lens in ([L, 4000, 299, 64], [30001, 5000, L + 1, 17]):
        new_lens = torch.tensor(lens, dtype=torch.int32)
        seq_lens.copy_(new_lens)
        q.copy_(torch.randn(q.shape, generator=g))
        new_k.copy_(torch.randn(new_k.shape, generator=g))
        new_v.copy_(torch.randn(new_v.shape, generator=g))
        tables = kv.block_tables.cpu()
        rows = slots_of(tables, PAGE, [(n - L, n) for n in lens])
        rows[1::3] = -1                                 # some padding rows: their slots keep the old K/V
        slots.copy_(rows)
        eager_pools = tuple(None if p is None else p.clone() for p in pools)
        want = step(*eager_pools)
        graph.replay()
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        for got_pool, want_pool in zip(pools, eager_pools):
            if got_pool is not None:
                torch.testing.assert_close(got_pool, want_pool, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(out, ref(q, cu, Paged(*pools, kv.block_tables, seq_lens), D ** -0.5), **BF16_TOL)


def test_row_tiles_of_a_long_verify():
    """Rows x the group of q heads fit one program up to MAX_TILE_ROWS; more are split into as few tiles as fit."""
    from qwendesk_kernels.attention import decode_row_tiles
    assert decode_row_tiles(6, 6) == (6, 1)          # a round of 5 drafts on the 27B: one 36-row program
    assert decode_row_tiles(8, 8) == (8, 1)
    assert decode_row_tiles(16, 6) == (8, 2)         # a block drafter's 15 drafts on the 27B: two of 48 rows
    assert decode_row_tiles(16, 8) == (8, 2)
    assert decode_row_tiles(16, 1) == (16, 1)
    assert decode_row_tiles(11, 6) == (6, 2)         # the last tile has 5 rows


@pytest.mark.parametrize("quant", [False, True])
def test_decode_of_16_rows_in_two_row_tiles_matches_ref(quant):
    """A verify of 16 rows with 6 q heads a kv head (the 27B's group): two programs per sequence and kv head, each
    row's causal limit its own, the keys visible to every row of a tile taken unmasked."""
    L, lens = 16, [16, 37, 150]
    q, cu, kv = decode_inputs(lens, L, 6, 1, 32, page=16, quant=quant)
    want = ref(q, cu, kv, 32 ** -0.5)
    for splits in (1, 3):
        got = decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 32 ** -0.5, L, splits,
                               **(kv.scales if quant else {}))
        torch.testing.assert_close(got, want, **({"atol": 1e-5, "rtol": 1e-5} if quant else tol(q.dtype)))


# --- a block drafter's attention (block_attention: the decode kernel, not causal and / or windowed) ---------------

@pytest.mark.parametrize("causal,window", [(False, 0), (True, 5), (False, 5), (True, 40), (False, 300)])
@pytest.mark.parametrize("quant", [False, True])
def test_block_attention_matches_ref(causal, window, quant):
    """Blocks of 8 rows (6 q heads a kv head: two row tiles) at the end of sequences of 8 .. 150 keys: every row sees
    the whole block or the rows up to itself, within a window shorter than a key block, longer than a page, longer
    than the sequence; a split may hold no key of a row's window."""
    from qwendesk_kernels.attention import block_attention
    L, lens = 8, [8, 37, 150, 64]
    q, cu, kv = decode_inputs(lens, L, 6, 1, 32, page=16, quant=quant)
    want = paged_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, 32 ** -0.5,
                               causal=causal, window=window, **kv.scales)
    assert torch.isfinite(want).all()
    for splits in (1, 3):
        got = decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 32 ** -0.5, L, splits,
                               causal=causal, window=window, **kv.scales)
        torch.testing.assert_close(got, want, **({"atol": 1e-5, "rtol": 1e-5} if quant else tol(q.dtype)))
    got = block_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 32 ** -0.5, L, causal=causal,
                          window=window, **kv.scales)
    torch.testing.assert_close(got, want, **({"atol": 1e-5, "rtol": 1e-5} if quant else tol(q.dtype)))


def test_block_attention_ref_masks():
    """The reference's masks, row by row, on one sequence of 10 keys whose last 4 are the block (one head, V = the
    key's position one-hot, so each output row is the softmax weight each key got)."""
    total, L, d = 10, 4, 16
    k = torch.zeros(1, total, 1, d)
    v = torch.eye(d)[:total].view(1, total, 1, d)
    q = torch.zeros(L, 1, d)
    tables, lens, cu = torch.tensor([[0]]), torch.tensor([total]), torch.tensor([0, L])

    def seen(**kw):
        o = paged_attention_ref(q, k, v, tables, cu, lens, 1.0, **kw)[:, 0, :total]
        return [[int(x > 0) for x in row] for row in o.tolist()]
    assert seen(causal=True) == [[1] * 7 + [0] * 3, [1] * 8 + [0] * 2, [1] * 9 + [0], [1] * 10]
    assert seen(causal=False) == [[1] * 10] * 4
    assert seen(causal=True, window=3) == [[0] * 4 + [1] * 3 + [0] * 3, [0] * 5 + [1] * 3 + [0] * 2,
                                           [0] * 6 + [1] * 3 + [0], [0] * 7 + [1] * 3]
    assert seen(causal=False, window=2) == [[0] * 5 + [1] * 3 + [0] * 2, [0] * 6 + [1] * 3 + [0],
                                            [0] * 7 + [1] * 3, [0] * 8 + [1] * 2]


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window", [(False, 0), (True, 2048)])
@pytest.mark.parametrize("quant", [False, True])
def test_gpu_block_attention_of_the_27b_drafter(causal, window, quant):
    """The 27B DFlash drafter's attention (32 q heads over 8 kv heads of 128, 16-row blocks): its full layer (every
    row sees the whole block) and its sliding layers (2,048 keys) over contexts shorter and longer than the window."""
    from qwendesk_kernels.attention import block_attention
    L, lens = 16, [16, 700, 2100, 5000]
    q, cu, kv = decode_inputs(lens, L, 32, 8, 128, PAGE, torch.bfloat16, quant)
    got = block_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 128 ** -0.5, L, causal=causal,
                          window=window, max_seq_len=8192, **kv.scales)
    want = paged_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.seq_lens, 128 ** -0.5,
                               causal=causal, window=window, **kv.scales)
    torch.testing.assert_close(got, want, **BF16_TOL)

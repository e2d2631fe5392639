"""Weight-only int4 / int8 linear kernels and the int8 embedding gather against their torch references.

CPU: the Triton kernels run in the interpreter (fp32 / fp16, small odd shapes, the plain-Triton code path; the GPU
adds one inline-PTX lop3). GPU (`gpu` mark): bf16 at the 27B projection shapes, every GEMV M bucket, the large-M
path, a sweep of forced configs (split-K, tiles, stages: whatever the autotuner picks must be right), CUDA-graph
replay of the M <= 32 paths. Both int4 GEMV variants (A: tensor-core dots, C: inline mma.sync for M <= 8) are
tested whichever is the default.
"""

import functools

import pytest
import torch

from qwendesk_kernels.bench_quant import HIDDEN, LM_HEAD, PROJ
from qwendesk_kernels.activation import silu_mul, silu_mul_ref
from qwendesk_kernels import gemv_mma
from qwendesk_kernels.gemv_mma import GEMV_MMA_DEFAULT, gemv, gemv_mma_configs, gemv_mma_grid
from qwendesk_kernels.quant import (int4_linear, int4_linear_triton, int4_swiglu, int8_embedding, int8_embedding_triton,
                           int8_linear, int8_linear_triton)
from qwendesk_kernels.quant_format import (dequantize_int4_ref, dequantize_int8_ref, int4_linear_ref,
                                  int8_embedding_ref,
                                  int8_linear_ref, pack_int4, pack_int4_codes, pack_int8, pack_int8_as_int4,
                                  tile_group_params,
                                  unpack_int4, unpack_int4_codes, untile_group_params, write_group_param_rows,
                                  write_int4_rows)
from qwendesk_kernels.splitk import SPLITK_FLOATS, splitk_scratch

M_CPU = [1, 3, 8, 17, 32, 33, 100, 300]     # GEMV buckets 8 / 16 / 32, the fused GEMM (M tiles), dequantise + matmul


pytestmark = pytest.mark.usefixtures("poisoned_outputs")   # see tests/conftest.py


def random_int4(N, K, G, dtype, device="cpu", seed=0):
    gen = torch.Generator(device).manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device=device, generator=gen)
    scales = (0.002 + 0.01 * torch.rand(N, K // G, device=device, generator=gen)).to(dtype)
    zeros = (15 * torch.rand(N, K // G, device=device, generator=gen)).to(dtype)
    return pack_int4(q, scales, zeros, G), q


def random_int8(N, K, G, dtype, device="cpu", seed=0):
    gen = torch.Generator(device).manual_seed(seed)
    q = torch.randint(-128, 128, (N, K), dtype=torch.int8, device=device, generator=gen)
    scales = (0.0002 + 0.001 * torch.rand(N, K // G, device=device, generator=gen)).to(dtype)
    return pack_int8(q, scales, G), q


def check(out, ref, tol):
    """Close to the reference relative to its largest magnitude (the output's rounding scale)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())


TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


# ---------------------------------------------------------------------------------------------------- formats

@pytest.mark.parametrize("N,K,G", [(64, 64, 64), (192, 320, 64), (128, 384, 128), (64, 192, 32)])
def test_int4_pack_roundtrip_and_layout(N, K, G):
    w, q = random_int4(N, K, G, torch.float32)
    assert w.qweight.dtype == torch.int32 and w.qweight.shape == (-(-N // 16), -(-K // 128), 16, 16)
    assert w.shape == (N, K) and w.scales.shape == w.zeros.shape == (-(-N // 16), K // G, 16)
    codes, scales, zeros = unpack_int4(w)
    assert torch.equal(codes, q)
    # the documented layout: qweight[n // 16, b, n % 16, j], nibble p + 4 t holds the code of k = 128 b + 32 p + 2 j + t
    for n, b, p, j, t in ((N - 1, (K - 1) // 128, 1, 5, 1), (17, 0, 3, 15, 0)):
        k = 128 * b + 32 * p + 2 * j + t
        if k < K:
            word = int(w.qweight[n // 16, b, n % 16, j]) & 0xFFFFFFFF
            assert (word >> (4 * (p + 4 * t))) & 0xF == q[n, k]
    # scales and zeros: [n // 16, group, 2 (n % 8) + n % 16 // 8], rows n and n + 8 of a tile side by side
    numbered = torch.arange(N * (K // G), dtype=torch.float32).view(N, K // G)
    w2 = pack_int4(q, numbered, -numbered, G)
    for n, g in ((N - 1, K // G - 1), (9, 0), (16, K // G - 1)):
        assert w2.scales[n // 16, g, 2 * (n % 8) + n % 16 // 8] == numbered[n, g]
        assert w2.zeros[n // 16, g, 2 * (n % 8) + n % 16 // 8] == -numbered[n, g]
    s = scales.repeat_interleave(G, 1)
    z = zeros.repeat_interleave(G, 1)
    torch.testing.assert_close(dequantize_int4_ref(w), (q.float() - z) * s)


def test_group_params_rows_written_anywhere():
    """Scales of a fused projection's parts land at any row of the row tiles; the padding rows stay zero."""
    s = torch.randn(45, 3)
    tiles = torch.zeros(3, 3, 16)
    for row, n in ((0, 7), (7, 20), (27, 18)):
        write_group_param_rows(tiles, row, s[row:row + n])
    assert torch.equal(tiles, tile_group_params(s)) and torch.equal(untile_group_params(tiles, 45), s)
    assert not tiles.view(3, 3, 8, 2)[2, :, 5:, 1].any()            # rows 45..47


def test_write_int4_rows_across_tiles():
    """A fused projection's parts land at any row: the tiles they touch are rewritten, the other rows kept."""
    q = torch.randint(0, 16, (45, 192), dtype=torch.uint8)
    words = pack_int4_codes(torch.zeros_like(q))
    for row, n in ((0, 7), (7, 20), (27, 18)):                 # inside a tile, across two, up to a partial last one
        write_int4_rows(words, row, q[row:row + n])
    assert torch.equal(unpack_int4_codes(words, 45, 192), q)
    assert words.shape == (3, 2, 16, 16) and not words[2, :, 13:].any()    # padding rows stay zero
    q[16:32] = 15 - q[16:32]
    write_int4_rows(words, 16, q[16:32])                        # one whole tile: packed as it is
    assert torch.equal(unpack_int4_codes(words, 45, 192), q)


def test_int8_pack_dequant():
    w, q = random_int8(64, 128, 64, torch.float16)
    assert w.qweight.dtype == torch.int8 and torch.equal(w.qweight, q)
    ref = (q.float() * w.scales.float().repeat_interleave(64, 1)).half()
    assert torch.equal(dequantize_int8_ref(w), ref)


def test_int8_as_int4_planes_is_exact():
    """An int8 weight as two int4 planes over 2K (codes u >> 4 | u & 15 of u = q + 128, scales 16 s | s, zeros
    8 | 0) dequantises to the very same weight, every code from -128 to 127 included."""
    w8, q = random_int8(64, 256, 64, torch.bfloat16)
    q[0] = torch.arange(-128, 128, dtype=torch.int8)
    w8 = pack_int8(q, w8.scales, 64)
    planes = pack_int8_as_int4(q, w8.scales, 64)
    assert planes.shape == (64, 512) and planes.x_repeats == 2
    assert torch.equal(dequantize_int4_ref(planes), dequantize_int8_ref(w8))


# ---------------------------------------------------------------------------------------------------- CPU kernels

@pytest.mark.parametrize("M", M_CPU)
@pytest.mark.parametrize("K,G", [(320, 64), (384, 128)])     # K = 320: a padded half block
def test_int4_linear(M, K, G):
    w, _ = random_int4(192, K, G, torch.float32)
    x = torch.randn(M, K)
    check(int4_linear_triton(x, w), int4_linear_ref(x, w), TOL[torch.float32])


@pytest.mark.parametrize("M", [1, 17, 40])
@pytest.mark.parametrize("G", [32, 64])
def test_int4_linear_fp16(M, G):
    w, _ = random_int4(128, 192, G, torch.float16, seed=1)
    x = torch.randn(M, 192).half()
    check(int4_linear_triton(x, w), int4_linear_ref(x, w), TOL[torch.float16])


@pytest.mark.parametrize("config", [
    dict(BM=8, BN=64, SPLIT_K=3),          # split-K: the last split of each tile sums the partials
    dict(BM=16, BN=128, SPLIT_K=2),        # one tile wider than N
    dict(BM=32, BN=32, SPLIT_K=8),         # more splits than K blocks: empty splits still count in
])
def test_int4_gemv_configs(config):
    w, _ = random_int4(192, 320, 64, torch.float32, seed=2)
    x = torch.randn(5, 320)
    ref = int4_linear_ref(x, w)
    check(int4_linear_triton(x, w, config, variant="A"), ref, TOL[torch.float32])
    check(int4_linear_triton(x, w, config, variant="A"), ref, TOL[torch.float32])     # counters were reset
    assert_splitk_counters_reset(x.device)


def assert_splitk_counters_reset(device):
    """Between launches every split-K counter is 0 again (what the next launch relies on)."""
    assert not bool(splitk_scratch(device)[1].any())


@pytest.mark.parametrize("M,config", [
    (70, dict(BM=64, BN=64, SPLIT_K=1)),          # two M tiles, the second part-filled
    (130, dict(BM=128, BN=128, SPLIT_K=1)),       # a weight tile wider than N
    (64, dict(BM=64, BN=32, SPLIT_K=1)),          # exactly one M tile
])
def test_int4_fused_gemm_m_tiles(M, config):
    """The dot GEMV tiled over M (the fused GEMM of short prefill steps): every M tile's rows, none written twice."""
    w, _ = random_int4(192, 320, 64, torch.float32, seed=4)
    x = torch.randn(M, 320)
    check(int4_linear_triton(x, w, config, variant="A"), int4_linear_ref(x, w), TOL[torch.float32])


def linear_c(x, w, config=None):
    return int4_linear_triton(x, w, config, variant="C")


@pytest.mark.parametrize("M,K,G,dtype,config", [
    (1, 384, 128, torch.float16, None),                         # 6 units, one per program: 3 partials per row group
    (8, 320, 64, torch.bfloat16, dict(NW=2, UNROLL=2, PER=2)),  # a padded half block; runs of 2 of 3 blocks
    (3, 640, 64, torch.float16, dict(NW=1, R=1, UNROLL=1, PER=4)),      # 3 tiles x 5 blocks: runs cross row groups
    (2, 384, 128, torch.bfloat16, dict(NW=2, R=2, PER=100)),    # one program does all; the second tile past N = 40
    (5, 1024, 128, torch.bfloat16, dict(NW=4, R=1, UNROLL=2, PER=3)),
    (8, 1152, 128, torch.bfloat16, dict(NW=1, R=2, UNROLL=2, PER=7)),   # odd runs, unrolled twice
    (4, 192, 64, torch.bfloat16, dict(NW=1, R=2, UNROLL=2, PER=1)),     # a padded half block, one block per program
    (9, 384, 128, torch.bfloat16, None),                        # two column tiles, the second with one row
    (16, 256, 64, torch.float16, dict(NW=1, R=1, UNROLL=1, PER=1)),
    (21, 320, 64, torch.bfloat16, dict(NW=2, UNROLL=2, PER=2, L1=False)),
    (32, 384, 128, torch.bfloat16, dict(NW=1, R=2, UNROLL=2, PER=2)),
    (12, 384, 128, torch.bfloat16, dict(NW=1, R=2, UNROLL=2, PER=2, XT=True)),   # both column tiles in each warp
    (16, 320, 64, torch.float16, dict(NW=2, R=1, UNROLL=1, PER=1, XT=True)),
    (21, 384, 128, torch.bfloat16, dict(NW=1, R=2, UNROLL=2, PER=2, XT=True)),   # two warps, a pair of tiles each
    (32, 320, 64, torch.float16, dict(NW=2, R=1, UNROLL=1, PER=1, XT=True)),
])
def test_int4_gemv_mma(M, K, G, dtype, config):
    """The mma GEMV (mma.sync written out for the interpreter: the same fragments), N = 40: a partial row tile."""
    w, _ = random_int4(40, K, G, dtype, seed=10)
    x = torch.randn(M, K).to(dtype)
    ref = int4_linear_ref(x, w)
    check(linear_c(x, w, config), ref, TOL[dtype])
    check(linear_c(x, w, config), ref, TOL[dtype])              # the split-K counters were reset
    assert_splitk_counters_reset(x.device)


@pytest.mark.parametrize("M,K,config", [
    (1, 640, None),                                     # 15 one-block programs: 6 partials per row group
    (3, 640, dict(NW=1, R=2, UNROLL=2, PER=3)),         # runs cross row groups
    (8, 384, dict(NW=2, R=2, UNROLL=1, PER=100)),       # one program, two warps, no partials
])
def test_int4_gemv_mma_swiglu(M, K, config):
    """SwiGLU in the mma GEMV's epilogue (gate rows 0..47, up rows 48..95): the projection's values, then silu_mul."""
    w, _ = random_int4(96, K, 128, torch.float16, seed=12)
    x = torch.randn(M, K).half()
    y = torch.empty(M, 48, dtype=torch.float16)
    gemv(x, w, y, config, swiglu=True)
    check(y, silu_mul_ref(linear_c(x, w, config)), TOL[torch.float16])
    check(int4_swiglu(x, w), silu_mul_ref(int4_linear_ref(x, w)), TOL[torch.float16])    # (the CPU path)


@pytest.mark.parametrize("config", [None, dict(NW=2, UNROLL=2, PER=1), dict(NW=1, R=2, UNROLL=2, PER=1, XT=True)])
def test_int4_gemv_mma_rows_do_not_depend_on_m(config):
    """A row of y has the same bits at every M (1 .. 32, any column tile; XT: a pair of tiles in each warp, against
    the tiles in warps of their own at 32): a speculative verify's rows are what plain decoding computes for them, so
    greedy speculation stays exact."""
    w, _ = random_int4(40, 256, 64, torch.bfloat16, seed=13)
    x = torch.randn(32, 256).to(torch.bfloat16)
    full = linear_c(x, w, config and {**config, "XT": False})
    for M in (1, 8, 12, 17, 31, 32):
        assert torch.equal(linear_c(x[:M], w, config), full[:M]), M
    gate_up, _ = random_int4(64, 256, 64, torch.bfloat16, seed=14)
    swiglu = torch.empty(32, 32, dtype=torch.bfloat16)
    gemv(x, gate_up, swiglu, config and {**config, "XT": False}, swiglu=True)
    for M in (3, 17, 32):
        part = torch.empty(M, 32, dtype=torch.bfloat16)
        gemv(x[:M], gate_up, part, config, swiglu=True)
        assert torch.equal(part, swiglu[:M]), M


def test_int4_gemv_mma_strided_x():
    """x from a column slice of a wider buffer: read as int32 pairs, 4 at a time, so it is copied when misaligned."""
    w, _ = random_int4(32, 256, 128, torch.float16, seed=11)
    for extra in (3, 8, 16):
        x = torch.randn(2, 256 + extra).half()[:, extra:]
        check(linear_c(x, w), int4_linear_ref(x, w), TOL[torch.float16])


def test_gemv_variant_switch():
    """The default: the mma GEMV for 16-bit x, M <= 32 and group 64 / 128; else the dot GEMV."""
    w32, _ = random_int4(32, 128, 64, torch.float32, seed=9)
    w16, _ = random_int4(32, 128, 64, torch.float16, seed=9)
    w16_g32, _ = random_int4(32, 128, 32, torch.float16, seed=9)
    for w, M, dtype, variant in ((w32, 4, torch.float32, "A"), (w16, 1, torch.float16, "C"),
                                 (w16, 8, torch.float16, "C"), (w16, 9, torch.float16, "C"),
                                 (w16, 16, torch.float16, "C"), (w16, 32, torch.float16, "C"),
                                 (w16, 33, torch.float16, "A"),
                                 (w16_g32, 2, torch.float16, "A")):
        x = torch.randn(M, 128).to(dtype)
        assert torch.equal(int4_linear_triton(x, w), int4_linear_triton(x, w, variant=variant))


def test_the_default_int4_gemv_rows_do_not_depend_on_m():
    """What the engine runs (no variant, no config): a row of y has the same bits at every M up to 32, for an int4
    weight, an int8 one held as int4 planes (the LM head) and the fused SwiGLU, so that a speculative verify's rows
    (c x (k + 1) of them) are what a plain step of c rows computes and greedy speculation stays exact. The dot GEMV's
    rows differ from the mma GEMV's, so the default must not switch kernels below 32 rows."""
    w, _ = random_int4(48, 256, 64, torch.float16, seed=21)
    w8, q = random_int8(48, 256, 64, torch.float16, seed=22)
    planes = pack_int8_as_int4(q, w8.scales, 64)
    x = torch.randn(32, 256).half()
    for weight in (w, planes):
        full = int4_linear_triton(x, weight)
        for M in (1, 4, 8, 12, 16, 17, 24, 31):
            assert torch.equal(int4_linear_triton(x[:M], weight), full[:M]), M
    gate_up, _ = random_int4(64, 256, 64, torch.float16, seed=23)
    full = torch.empty(32, 32, dtype=torch.float16)
    gemv(x, gate_up, full, None, swiglu=True)
    for M in (8, 24):
        part = torch.empty(M, 32, dtype=torch.float16)
        gemv(x[:M], gate_up, part, None, swiglu=True)
        assert torch.equal(part, full[:M]), M


def test_gemv_rows_config(monkeypatch):
    """`engine.bench --gemv-rows xt`: past 8 rows the default takes the mma GEMV's XT config; at 8 rows and below it
    keeps GEMV_MMA_DEFAULT."""
    monkeypatch.setattr(gemv_mma, "ROWS_CONFIG", gemv_mma.GEMV_MMA_XT)
    w, _ = random_int4(32, 128, 64, torch.float16, seed=9)
    for M, config in ((8, gemv_mma.GEMV_MMA_DEFAULT), (12, gemv_mma.GEMV_MMA_XT), (32, gemv_mma.GEMV_MMA_XT)):
        x = torch.randn(M, 128).half()
        assert gemv_mma.gemv_mma_supports(x, w)
        assert torch.equal(int4_linear_triton(x, w), linear_c(x, w, config)), M
    assert not gemv_mma.gemv_mma_supports(torch.randn(33, 128).half(), w)


@pytest.mark.parametrize("M,G", [(m, 64) for m in M_CPU] + [(1, 128), (33, 128)])
def test_int8_linear(M, G):
    w, _ = random_int8(192, 256, G, torch.float32)
    x = torch.randn(M, 256)
    check(int8_linear_triton(x, w), int8_linear_ref(x, w), TOL[torch.float32])


@pytest.mark.parametrize("M", [1, 3, 8, 17, 40])
@pytest.mark.parametrize("G", [64, 128])
def test_int8_as_int4_planes_linear(M, G):
    """x read twice by the mma GEMV (M <= 8), repeated for the dot GEMV and the dequantise + matmul path (fp16: Triton's
    interpreter gets bf16 tl.dot and bf16 arithmetic wrong, which the dot GEMV uses; the GPU tests cover bf16)."""
    w8, q = random_int8(96, 256, G, torch.float16, seed=5)
    planes = pack_int8_as_int4(q, w8.scales, G)
    x = torch.randn(M, 256).half()
    check(int4_linear_triton(x, planes), int8_linear_ref(x, w8), TOL[torch.float16])


@pytest.mark.parametrize("M", [1, 17, 40])
def test_int8_linear_fp16_strided(M):
    """fp16 activations (read as 32-bit pairs) from a column slice of a wider buffer, odd and even row strides."""
    w, _ = random_int8(128, 192, 64, torch.float16, seed=3)
    for extra in (3, 8):
        x = torch.randn(M, 192 + extra).half()[:, extra:]
        check(int8_linear_triton(x, w), int8_linear_ref(x, w), TOL[torch.float16])


def test_int8_gemv_split_k():
    w, _ = random_int8(192, 256, 64, torch.float32, seed=4)
    x = torch.randn(3, 256)
    check(int8_linear_triton(x, w, dict(BM=8, BN=64, SPLIT_K=3)), int8_linear_ref(x, w), TOL[torch.float32])


def test_leading_dims_and_empty():
    w, _ = random_int4(64, 128, 64, torch.float32)
    x = torch.randn(2, 3, 128)
    out = int4_linear_triton(x, w)
    assert out.shape == (2, 3, 64)
    check(out, int4_linear_ref(x, w), TOL[torch.float32])
    assert int4_linear_triton(torch.randn(0, 128), w).shape == (0, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_embedding(dtype):
    w, _ = random_int8(100, 192, 64, dtype)
    ids = torch.tensor([5, 0, 99, 5, 42, 7])
    assert torch.equal(int8_embedding_triton(ids, w), int8_embedding_ref(ids, w))
    ids2 = ids.view(2, 3)
    assert torch.equal(int8_embedding_triton(ids2, w), int8_embedding_ref(ids2, w).view(2, 3, 192))


def test_cpu_dispatch_is_the_reference():
    w4, _ = random_int4(64, 128, 64, torch.float32)
    w8, _ = random_int8(64, 128, 64, torch.float32)
    x = torch.randn(3, 128)
    assert torch.equal(int4_linear(x, w4), int4_linear_ref(x, w4))
    assert torch.equal(int8_linear(x, w8), int8_linear_ref(x, w8))
    ids = torch.tensor([1, 63])
    assert torch.equal(int8_embedding(ids, w8), int8_embedding_ref(ids, w8))


# ---------------------------------------------------------------------------------------------------- GPU

M_GEMV = [1, 2, 4, 8, 16, 32]
_weights = {}


def test_gemv_mma_grid_27b():
    """The mma GEMV's stream-K grid at the 27B shapes: one wave of at most PER_SM programs per SM covering every unit
    once, with the partials of the programs that share a row group inside the scratch."""
    for N, K in PROJ.values():
        for c in gemv_mma_configs():
            programs, per = gemv_mma_grid(N, K, c, sms=132)
            units = -(-N // (16 * c["R"] * c["NW"])) * (K // 128)
            assert programs <= c["PER_SM"] * 132 and (programs - 1) * per < units <= programs * per
            assert (-(-(K // 128) // per) + 1) * 8 * N <= SPLITK_FLOATS
    assert gemv_mma_grid(34816, 5120, gemv_mma_configs()[0], 132) == (2073, 21)    # 1,088 row groups x 40 blocks
    assert gemv_mma_grid(5120, 17408, gemv_mma_configs()[0], 132) == (1979, 11)    # 160 x 136
    # an int4 LM head (7,760 row groups x 40 blocks): whole row groups per program, no partial sums to keep
    assert gemv_mma_grid(248320, 5120, gemv_mma_configs()[0], 132) == (1940, 160)


def weight_27b(name, bits=4, G=128):
    """Cached random bf16-scaled weights at a 27B shape (GPU)."""
    key = (name, bits, G)
    if key not in _weights:
        if bits == 4:
            N, K = PROJ[name]
            _weights[key] = random_int4(N, K, G, torch.bfloat16, "cuda")[0]
        else:
            _weights[key] = random_int8(*LM_HEAD, G, torch.bfloat16, "cuda")[0]
    return _weights[key]


def rel_err(out, ref):
    assert torch.isfinite(out).all()
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PROJ))
@pytest.mark.parametrize("M", M_GEMV + [512, 8192])
def test_int4_linear_gpu(name, M):
    w = weight_27b(name)
    x = torch.randn(M, w.shape[1], dtype=torch.bfloat16, device="cuda")
    out, ref = int4_linear(x, w), int4_linear_ref(x, w)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    assert rel_err(out, ref) < 5e-3
    check(out, ref, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("M", M_GEMV + [512])
def test_int8_lm_head_gpu(M):
    w = weight_27b("lm_head", bits=8)
    x = torch.randn(M, HIDDEN, dtype=torch.bfloat16, device="cuda")
    out, ref = int8_linear(x, w), int8_linear_ref(x, w)
    assert rel_err(out, ref) < 5e-3
    check(out, ref, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("M", M_GEMV + [512])
def test_int8_lm_head_as_int4_planes_gpu(M):
    """The 27B's int8 LM head as the engine holds it: two int4 planes over 2K (the mma GEMV reads x twice)."""
    w8 = weight_27b("lm_head", bits=8)
    if "planes" not in _weights:
        _weights["planes"] = pack_int8_as_int4(w8.qweight, w8.scales, w8.group_size)
    x = torch.randn(M, HIDDEN, dtype=torch.bfloat16, device="cuda")
    out, ref = int4_linear(x, _weights["planes"]), int8_linear_ref(x, w8)
    assert rel_err(out, ref) < 5e-3
    check(out, ref, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("M", [1, 7, 16, 29])
@pytest.mark.parametrize("tile", [(32, 1, 2), (64, 1, 3), (128, 2, 2), (256, 4, 3)])
@pytest.mark.parametrize("split", [1, 4, 8])
def test_gemv_forced_configs_gpu(bits, M, tile, split):
    """Every (tile, warps, stages, split-K) the autotuner may pick computes the same thing."""
    BN, warps, stages = tile
    bm = 8 if M <= 8 else 16 if M <= 16 else 32
    config = dict(BM=bm, BN=BN, SPLIT_K=split, num_warps=warps, num_stages=stages)
    if bits == 4:
        w, linear, ref_fn = weight_27b("attn_o"), functools.partial(int4_linear_triton, variant="A"), int4_linear_ref
    else:
        w, linear, ref_fn = random_int8(4096, 6144, 128, torch.bfloat16, "cuda")[0], int8_linear_triton, int8_linear_ref
    x = torch.randn(M, w.shape[1], dtype=torch.bfloat16, device="cuda")
    ref = ref_fn(x, w)
    for _ in range(2):                                       # the split-K counters reset themselves
        out = linear(x, w, config)
        assert rel_err(out, ref) < 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("M", [33, 100, 128])
@pytest.mark.parametrize("name", ["mlp_down", "gdn_in_qkvz"])
def test_int4_fused_gemm_configs_gpu(name, M):
    """Every M-tile config the autotuner may pick for the fused GEMM (and its own pick) at the 27B shapes, bf16."""
    from qwendesk_kernels.gemv_dot import _CONFIGS
    w = weight_27b(name)
    x = torch.randn(M, w.shape[1], dtype=torch.bfloat16, device="cuda")
    ref = int4_linear_ref(x, w)
    assert rel_err(int4_linear_triton(x, w, variant="A"), ref) < 5e-3
    for cfg in _CONFIGS:
        if cfg.kwargs["BM"] >= 64:
            config = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            assert rel_err(int4_linear_triton(x, w, config, variant="A"), ref) < 5e-3, config


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,G", [(torch.float16, 128), (torch.bfloat16, 64)])
def test_int4_other_dtype_and_group_gpu(dtype, G):
    """fp16 activations and group 64, with one forced GEMV config each (the autotuner is exercised above)."""
    N, K = PROJ["attn_o"]
    w = random_int4(N, K, G, dtype, "cuda", seed=5)[0]
    for M in (1, 9, 32, 300):
        x = torch.randn(M, K, dtype=dtype, device="cuda")
        bm = 8 if M <= 8 else 16 if M <= 16 else 32
        out = int4_linear_triton(x, w, dict(BM=bm, BN=64, SPLIT_K=2, num_warps=1) if M <= 32 else None, variant="A")
        assert rel_err(out, int4_linear_ref(x, w)) < (2e-3 if dtype == torch.float16 else 5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PROJ))
@pytest.mark.parametrize("M", [1, 2, 3, 4, 8, 12, 16, 24, 32])
def test_int4_gemv_mma_gpu(name, M):
    """The mma GEMV with its default and each benchmarked config at the 27B shapes, bf16: the inline mma.sync relies on
    Triton laying a [32 NW] tensor out one element per lane, which only the GPU can check."""
    w = weight_27b(name)
    N, K = w.shape
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    ref = int4_linear_ref(x, w)
    for config in [None] + gemv_mma_configs():
        out = linear_c(x, w, config)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape
        assert rel_err(out, ref) < 5e-3
        check(out, ref, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PROJ))
def test_int4_gemv_mma_rows_do_not_depend_on_m_gpu(name):
    """On the GPU's mma.sync too: each row of a 32-row GEMV (and SwiGLU) has the bits it has at M = 1..8."""
    w = weight_27b(name)
    x = torch.randn(32, w.shape[1], dtype=torch.bfloat16, device="cuda")
    full = linear_c(x, w)
    for M in (1, 4, 8, 9, 16, 24):
        assert torch.equal(linear_c(x[:M], w), full[:M]), M
    for M in (9, 12, 16, 24, 32):           # a pair of column tiles in each warp: the mma's operands in its lanes
        assert torch.equal(linear_c(x[:M], w, {**GEMV_MMA_DEFAULT, "XT": True}), full[:M]), M
        assert torch.equal(linear_c(x[:M], w, {**GEMV_MMA_DEFAULT, "XT": True, "R": 1}), full[:M]), M
    if name == "mlp_gate_up":
        full = int4_swiglu(x, w)
        for M in (1, 8, 12):
            assert torch.equal(int4_swiglu(x[:M], w), full[:M]), M


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 32])
def test_splitk_repeats_bit_for_bit_gpu(M):
    """The split-K sum is deterministic: launched back to back at every 27B shape, each GEMV gives the same bits every
    time, and the split-K counters are 0 after."""
    for name in PROJ:
        w = weight_27b(name)
        x = torch.randn(M, w.shape[1], dtype=torch.bfloat16, device="cuda")
        first = linear_c(x, w)
        outs = [linear_c(x, w) for _ in range(20)]
        assert all(torch.equal(out, first) for out in outs), name
        assert_splitk_counters_reset(x.device)
    w = weight_27b("mlp_gate_up")
    x = torch.randn(M, w.shape[1], dtype=torch.bfloat16, device="cuda")
    first = int4_swiglu(x, w)
    assert all(torch.equal(int4_swiglu(x, w), first) for _ in range(20))
    assert_splitk_counters_reset(x.device)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 5, 8, 16, 32])
def test_int4_swiglu_gpu(M):
    """SwiGLU in the GEMV's epilogue at the 27B gate|up shape, with every two-tile config of the mma GEMV: as close to
    the fp32 reference as the projection followed by silu_mul. Not the same bits: a warp pairs a gate tile with its up
    tile, not with the next gate tile, so a gate row's K splits differ from the unfused launch's."""
    w = weight_27b("mlp_gate_up")
    x = torch.randn(M, w.shape[1], dtype=torch.bfloat16, device="cuda")
    ref = silu_mul_ref(int4_linear_ref(x, w))
    unfused = rel_err(silu_mul(int4_linear(x, w)), ref)
    outs = [int4_swiglu(x, w)]
    for config in [c for c in gemv_mma_configs() if c.get("R", 2) == 2]:      # (a gate tile and its up tile per warp)
        outs.append(torch.empty(M, w.shape[0] // 2, dtype=torch.bfloat16, device="cuda"))
        gemv(x, w, outs[-1], config, swiglu=True)
    for out in outs:
        check(out, ref, TOL[torch.bfloat16])
        assert rel_err(out, ref) < 1.5 * unfused + 1e-4, (rel_err(out, ref), unfused)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,G", [(torch.float16, 128), (torch.float16, 64), (torch.bfloat16, 64)])
def test_int4_gemv_mma_other_dtype_and_group_gpu(dtype, G):
    N, K = PROJ["attn_o"]
    w = random_int4(N, K, G, dtype, "cuda", seed=5)[0]
    for M in (1, 5, 8):
        x = torch.randn(M, K, dtype=dtype, device="cuda")
        ref = int4_linear_ref(x, w)
        for config in (None, dict(NW=1, PER=7), dict(NW=2, PER=1000)):
            assert rel_err(linear_c(x, w, config), ref) < (2e-3 if dtype == torch.float16 else 5e-3)


@pytest.mark.gpu
def test_int8_embedding_gpu():
    w = weight_27b("lm_head", bits=8)
    ids = torch.randint(0, LM_HEAD[0], (4096,), device="cuda")
    assert torch.equal(int8_embedding(ids, w), int8_embedding_ref(ids, w))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4, 8, 16, 32])
def test_gemv_cuda_graph_gpu(M):
    """int4 projections and the int8 LM head captured in one CUDA graph replay exactly like eager calls."""
    names = ["gdn_in_qkvz", "gdn_out", "mlp_gate_up", "mlp_down", "attn_o"]
    ws = [weight_27b(n) for n in names]
    head = weight_27b("lm_head", bits=8)
    xs = [torch.randn(M, w.shape[1], dtype=torch.bfloat16, device="cuda") for w in ws]
    xh = torch.randn(M, HIDDEN, dtype=torch.bfloat16, device="cuda")

    def step():
        return [int4_linear(x, w) for x, w in zip(xs, ws)] + [int8_linear(xh, head), int4_swiglu(xs[2], ws[2])]

    step()                                       # autotune and allocate the scratch outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for x in xs + [xh]:
        x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, step()):
        assert torch.equal(got, want)

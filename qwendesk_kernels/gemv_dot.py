"""The dot GEMV (M <= 32 rows: decode, speculative verify; one launch, CUDA-graph capturable once autotuned), and
the same kernel tiled over M as the fused GEMM of short prefill steps (up to quant.FUSED_MAX_M rows):
- program = (BN weight rows, one K split, BM rows of x); y^T tile [BN, BM] = sum of dots v [BN, 32] x x^T [32, BM]
  with BM = 8, 16 or 32 (M padded) for a GEMV, 64 or 128 per M tile above: the weights are the tensor-core A
  operand, so warps split weight rows and nothing is dequantised twice within a program; sum_k x_k comes from a
  small dot with ones. The programs of one weight tile's M tiles run side by side and share its words through L2.
- split-K (GEMV only): each split writes an fp32 partial; the last split of a tile to arrive (atomic counter) sums
  them in split order, writes y and resets the counter. Deterministic, one launch.
- autotuned on (N, K, G, bits, M bucket) over (BM, BN, warps, split-K, stages); the interpreter runs one fixed config.
Int4 and int8 weights (qwendesk_kernels/quant_format.py: the layouts and how codes become floats); for int4 at M <= 8,
the mma GEMV (qwendesk_kernels/gemv_mma.py) is the default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.quant_format import group_param_offs, int4_row_words, pair_as_float
from qwendesk_kernels.runtime import INTERPRET, capability, sm_count
from qwendesk_kernels.splitk import SPLITK_COUNTERS, SPLITK_FLOATS, splitk_scratch, store_tile


@triton.jit
def int4_dots(w, blk, P0: tl.constexpr, RUNS: tl.constexpr, xt_cols, x_ok, K, ones,
               USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """Over nibble pairs P0 .. P0 + RUNS - 1 of the 16-word block blk: d [BN, BM] = sum_k v x^T and xs [16, BM]
    (every row sum_k x; a small dot with ones, on a load of its own so that its layout stays apart)."""
    dtype = xt_cols.dtype.element_ty
    c = tl.arange(0, 32)
    d = tl.zeros((BN, BM), tl.float32)
    xs = tl.zeros((16, BM), tl.float32)
    for p in tl.static_range(P0, P0 + RUNS):
        k = blk * 128 + p * 32 + c
        x_mask = (k[:, None] < K) & x_ok
        xt = tl.load(xt_cols + k[:, None], mask=x_mask, other=0.0)
        d = tl.dot(pair_as_float(w, p, False, dtype, USE_ASM), xt, d, input_precision=DOT_PRECISION)
        xt = tl.load(xt_cols + k[:, None], mask=x_mask, other=0.0, eviction_policy="evict_last")
        xs = tl.dot(ones, xt, xs, input_precision=DOT_PRECISION)
    return d, xs


@triton.jit
def _x_even_odd(xt_cols, k0, x_ok, EVICT: tl.constexpr):
    """x^T at k0 + 2c and at k0 + 2c + 1 (c < 32) as two [32, BM] tiles; 16-bit x: one 32-bit load per pair."""
    c = tl.arange(0, 32)
    x_mask = x_ok
    dtype = xt_cols.dtype.element_ty
    if dtype == tl.float32:
        even = tl.load(xt_cols + k0 + 2 * c[:, None], mask=x_mask, other=0.0, eviction_policy=EVICT)
        odd = tl.load(xt_cols + k0 + 1 + 2 * c[:, None], mask=x_mask, other=0.0, eviction_policy=EVICT)
    else:
        pairs = tl.load((xt_cols + k0).to(tl.pointer_type(tl.int32)) + c[:, None], mask=x_mask, other=0,
                        eviction_policy=EVICT)
        even = pairs.to(tl.int16).to(dtype, bitcast=True)
        odd = (pairs >> 16).to(tl.int16).to(dtype, bitcast=True)
    return even, odd


@triton.jit
def _int8_dots(w, blk, xt_cols, x_ok, ones,
               USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """The 64-k block blk of int8 words: d [BN, BM] = sum_k (v_l + v_h) x^T, xs [16, BM] as in int4_dots. Bytes
    (0, 2) of the words are k = 4j, 4j + 2: the even columns of x; bytes (1, 3) the odd ones."""
    dtype = xt_cols.dtype.element_ty
    even, odd = _x_even_odd(xt_cols, blk * 64, x_ok, "")
    d = tl.dot(pair_as_float(w, 0, False, dtype, USE_ASM), even, input_precision=DOT_PRECISION)
    d = tl.dot(pair_as_float(w, 1, True, dtype, USE_ASM), even, d, input_precision=DOT_PRECISION)
    d = tl.dot(pair_as_float(w, 2, False, dtype, USE_ASM), odd, d, input_precision=DOT_PRECISION)
    d = tl.dot(pair_as_float(w, 3, True, dtype, USE_ASM), odd, d, input_precision=DOT_PRECISION)
    even, odd = _x_even_odd(xt_cols, blk * 64, x_ok, "evict_last")
    xs = tl.dot(ones, even, input_precision=DOT_PRECISION)
    xs = tl.dot(ones, odd, xs, input_precision=DOT_PRECISION)
    return d, xs


@triton.jit
def dot_tile(xt_cols, x_ok, w_ptr, s_ptr, z_ptr, rn, row_ok, b0, b1, K, BITS: tl.constexpr, G: tl.constexpr,
             USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """y^T [BN, BM] fp32 = W[rn] @ x^T over the K blocks b0 .. b1 - 1 (128 k for int4, 64 k for int8): rn [BN] are
    the weight rows (row_ok: those that exist), column m of x^T starts at xt_cols [1, BM] (x_ok [1, BM]: the columns
    that exist; the others read as 0). w_ptr: int32 words, 16 per row and block."""
    BLOCK: tl.constexpr = 128 if BITS == 4 else 64
    GROUPS: tl.constexpr = BLOCK // G if G < BLOCK else 1        # groups per block
    blocks = tl.cdiv(K, BLOCK)
    groups = K // G
    if BITS == 4:                                             # (int8 rows are row-major, 16 words per block)
        w_rows = int4_row_words(w_ptr, rn, blocks)[:, None] + tl.arange(0, 16)[None, :]
    else:
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * (blocks * 16) + tl.arange(0, 16)[None, :]
    BLOCK_WORDS: tl.constexpr = 256 if BITS == 4 else 16
    ones = tl.full((16, 32), 1.0, xt_cols.dtype.element_ty)
    y = tl.zeros((BN, BM), tl.float32)
    for blk in range(b0, b1):
        w = tl.load(w_rows + blk * BLOCK_WORDS, mask=row_ok[:, None], other=0)
        for h in tl.static_range(GROUPS):
            if BITS == 4:
                d, xs = int4_dots(w, blk, h * (4 // GROUPS), 4 // GROUPS, xt_cols, x_ok, K, ones,
                                   USE_ASM, DOT_PRECISION, BN, BM)
                g = tl.minimum(blk * GROUPS + h, groups - 1)      # (K padding: x = 0 there)
                sz = group_param_offs(rn, g, groups)
                z = tl.load(z_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
            else:
                d, xs = _int8_dots(w, blk, xt_cols, x_ok, ones, USE_ASM, DOT_PRECISION, BN, BM)
                sz = rn * groups + blk * 64 // G                  # (int8 scales are row-major)
                z = 384.0                                         # W = 16 s (v_l + v_h) - 400 s
            s = tl.load(s_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
            y += (16.0 * s)[:, None] * d
            y -= ((16.0 + z) * s)[:, None] * tl.max(xs, axis=0)[None, :]       # every row of xs is sum_k x
    return y


@triton.jit(do_not_specialize=["M", "M_BUCKET", "SPLIT_K"])
def _gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_ym,
                 M_BUCKET, SPLIT_K, BITS: tl.constexpr, G: tl.constexpr, USE_ASM: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
    """y[:M, tile] (+)= x @ W^T over this program's K blocks. M_BUCKET only keys the autotuner."""
    pdl.enter(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    blocks = tl.cdiv(K, 128 if BITS == 4 else 64)
    per_split = tl.cdiv(blocks, SPLIT_K)
    b0 = pid_k * per_split
    b1 = tl.minimum(b0 + per_split, blocks)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    y = dot_tile(x_ptr + rm[None, :] * stride_xm, rm[None, :] < M, w_ptr, s_ptr, z_ptr, rn, rn < N, b0, b1, K,
                 BITS, G, USE_ASM, DOT_PRECISION, BN, BM)
    store_tile(y, rn[:, None], rm[None, :], y_ptr, part_ptr, count_ptr, M, N, stride_ym, pid_n, pid_k, SPLIT_K)


GEMV_BUCKETS = (8, 16, 32)       # a GEMV's rows are padded to one of these (its BM)
M_BUCKETS = GEMV_BUCKETS + (64, 128)     # the autotuning buckets: M rounded up to one of these (quant.FUSED_MAX_M)


def m_bucket(M: int) -> int:
    """The autotuning bucket of M rows: the GEMV's BM up to 32, then 64 and 128 (any M above: 128)."""
    return next((b for b in M_BUCKETS if M <= b), M_BUCKETS[-1])


def _prune_configs(configs, named_args, **kwargs):
    """Keep the configs with BM = the M bucket (a GEMV: split-K up to ~8 programs per SM and within the split-K
    scratch), or, above 32 rows, M tiles of BM <= the bucket without split-K. A card without warpgroup MMA (all but
    sm_90) keeps, at BM = 32, the tiles of 32 weight rows per warp (64 spill there: 255 registers and 16-224 B of
    stack on sm_86 / sm_89 / sm_120, `make check-consumer`), and M tiles of at most 32 floats per thread in each
    of their two accumulators (64 x 128 on 4 warps spilled 8 B on sm_86 in a C8 round of 5 drafts), those of 128
    rows in 2 stages only (3 took 139,264 B of shared memory on sm_86 / sm_89: a block drafter's 8 blocks of 16 rows);
    sm_90 keeps the configs it was tuned with."""
    args = {**named_args, **kwargs}
    bucket, N = args["M_BUCKET"], args["N"]
    sms = sm_count(args["y_ptr"].device)
    wgmma = capability(args["y_ptr"].device)[0] == 9
    kept = []
    for cfg in configs:
        bm, bn, split = cfg.kwargs["BM"], cfg.kwargs["BN"], cfg.kwargs["SPLIT_K"]
        tiles = triton.cdiv(N, bn)
        if bm == 32 and (bn, cfg.num_warps) not in (_TILES if wgmma else _TILES_NARROW + [(32, 1)]):
            continue
        if bucket in GEMV_BUCKETS:
            ok = bm == bucket and (split == 1 or (tiles * split <= 8 * sms and split * bm * N <= SPLITK_FLOATS
                                                   and tiles <= SPLITK_COUNTERS))
        else:       # (without wgmma: at most 32 floats per thread in each accumulator; BM = 128 in 2 stages)
            ok = (bm not in GEMV_BUCKETS and bm <= bucket and split == 1
                  and (wgmma or (bn * bm <= 32 * 32 * cfg.num_warps and (bm < 128 or cfg.num_stages == 2))))
        if ok:
            kept.append(cfg)
    return kept


def _bench_quick(fn, quantiles):
    """The autotuner's timer, shorter than Triton's default: one run tunes many shapes x configs."""
    return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)


# (BN, warps): 64 weight rows per warp balance the A-operand extraction, x^T reuse and registers; 4 warps x 64 rows
# run Hopper's warpgroup MMA. Two pipeline depths for the decode bucket (M <= 8), where latency hiding matters most.
_TILES = [(32, 1), (64, 1), (128, 2), (256, 4)]
# 32 weight rows per warp at BM = 32, for cards without warpgroup MMA (pruned to them: _prune_configs)
_TILES_NARROW = [(64, 2), (128, 4)]
_CONFIGS = [triton.Config(dict(BM=bm, BN=bn, SPLIT_K=sk), num_warps=nw, num_stages=st)
            for bm in GEMV_BUCKETS for bn, nw in _TILES + (_TILES_NARROW if bm == 32 else [])
            for sk in (1, 2, 4, 8) for st in ((2, 3) if bm == 8 else (2,))]
# M tiles (a short prefill step): two [BN, BM] fp32 accumulators per program, at most 128 registers per thread
_CONFIGS += [triton.Config(dict(BM=bm, BN=bn, SPLIT_K=1), num_warps=nw, num_stages=st)
             for bm, bn, nw in ((64, 64, 4), (64, 128, 4), (64, 128, 8), (128, 64, 4), (128, 64, 8), (128, 128, 8))
             for st in (2, 3)]
# cache_results: the choices are kept in Triton's cache dir, so the app's next start does not tune again
gemv_tuned = triton.autotune(_CONFIGS, key=["N", "K", "G", "BITS", "M_BUCKET"], do_bench=_bench_quick,
                              prune_configs_by={"early_config_prune": _prune_configs}, cache_results=True)(_gemv_kernel)


def gemv(x2, words, scales, zeros, y, bits: int, group_size: int, config: dict | None):
    """y [M, N] = x2 [M, K] @ W^T, M rows in tiles of BM (one tile up to 32 rows). config (BM, BN, SPLIT_K,
    optionally num_warps / num_stages) forces one config; None: the autotuner's (a fixed one under the
    interpreter)."""
    if bits == 8 and (x2.stride(0) % 2 or x2.data_ptr() % 4):
        x2 = x2.contiguous()                # 16-bit x is read as 32-bit pairs
    part, count = splitk_scratch(x2.device)
    (M, K), N = x2.shape, y.shape[1]
    args = dict(M=M, N=N, K=K, stride_xm=x2.stride(0), stride_ym=y.stride(0), M_BUCKET=m_bucket(M), BITS=bits,
                G=group_size, USE_ASM=not INTERPRET, DOT_PRECISION="ieee" if x2.dtype == torch.float32 else "tf32",
                **pdl.launch_args(x2.device))
    if config is None and INTERPRET:
        config = dict(BM=min(m_bucket(M), 64), BN=32, SPLIT_K=1)
    assert config is None or config["SPLIT_K"] == 1 or (config["BM"] >= M and (
        config["SPLIT_K"] * config["BM"] * N <= SPLITK_FLOATS and triton.cdiv(N, config["BN"]) <= SPLITK_COUNTERS)), \
        "split-K needs one M tile and must fit its scratch"
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), meta["SPLIT_K"], triton.cdiv(M, meta["BM"]))  # noqa: E731
    if config is None:
        gemv_tuned[grid](x2, words, scales, zeros, y, part, count, **args)
    else:
        _gemv_kernel[grid](x2, words, scales, zeros, y, part, count, **args, **config)

"""The MoE decode kernels (up to MOE_DECODE_MAX_T tokens: decode steps, speculative drafts): two launches that read
only the chosen experts' weights, with no sorting and no host sync (CUDA-graph capturable).

Layout. Routing (qwendesk_kernels/moe_route.py) gives token t its P (expert, weight) pairs, ids / weights [T, P], pair
p = t P + j. gate_up stacks every expert's gate rows then up rows, expert e's at [2 I e, 2 I (e + 1)), K = H; down
stacks their down rows, expert e's at [H e, H (e + 1)), K = I. Each is an Int4Weight (qwendesk_kernels/quant_format.py:
expert e's rows start at row tile 2 I e / 16, H e / 16) or a 16-bit tensor, on its own. The shared expert, when it
has the routed experts' shape, is expert E there (engine/model/moe.py).

- gate_up: program = (pair, BN rows n of I, a run of K blocks): the pair's expert's gate and up rows n against
  x[t]; h[pair, n] = silu(gate) * up with the unfused path's roundings (gemv_mma's SwiGLU epilogue). Runs of K:
  fp32 partials, the last program to arrive sums them in order and applies the SwiGLU (qwendesk_kernels/splitk.py).
- down: program = (token, BN rows n of H, a run of its pairs): y_n = sum over the run of w_j (h_j . down_{e_j, n}),
  runs summed in order by the last to arrive; out[t] rounded once.
Both split until there are ~PER_SM programs per SM (DEFAULT_CONFIG): at T = 1 and the 35B-A3B shape (H 2048, I 512, 8
experts + the shared one) the whole read is 13.5 MiB of int4, and programs that each stream a long row range keep too
few loads in flight to fill the GPU's memory pipe. Reading one expert for two tokens twice is left to L2.

Each program has one activation row, x column 0 of the tensor-core operand [32, BM] (the other columns zero): int4
by gemv_dot's dots (codes as 1 + c/16, scale and zero per group), 16-bit weights as they are; the next block's
weights are loaded ahead, as in the mma GEMV.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.activation import silu_mul_ref
from qwendesk_kernels.gemv_dot import int4_dots
from qwendesk_kernels.gemv_mma import store_swiglu
from qwendesk_kernels.quant_format import Int4Weight, group_param_offs, int4_linear_ref, int4_row_words, weight_rows
from qwendesk_kernels.runtime import INTERPRET, sm_count
from qwendesk_kernels.splitk import SPLITK_COUNTERS, SPLITK_FLOATS, arrive, splitk_scratch, store_tile

MOE_DECODE_MAX_T = 8            # tokens up to which the decode kernels run (above: the grouped path)
# BN: rows of I (gate_up: each with its gate and up rows) or H (down) per program; PER_SM: the splits aim at this
# many programs per SM (the best of qwendesk_kernels/bench_moe.py's sweep on the H200 at the 35B-A3B shape,
# docs/performance.md)
DEFAULT_CONFIG = dict(GATE_UP_BN=64, GATE_UP_WARPS=4, DOWN_BN=32, DOWN_WARPS=2, PER_SM=8)


def moe_decode_supports(gate_up, down) -> bool:
    """16-bit or int4 experts: int8 ones (held as int4 planes or not) take the sorted torch path."""
    return all(isinstance(w, torch.Tensor) or (isinstance(w, Int4Weight) and w.x_repeats == 1) for w in (gate_up, down))


def _linear_fp32(x: torch.Tensor, w) -> torch.Tensor:
    return int4_linear_ref(x.float(), w) if isinstance(w, Int4Weight) else x.float() @ w.float().t()


def moe_decode_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up, down,
                   inter: int) -> torch.Tensor:
    """The kernels' math in torch, pair by pair: h = silu_mul of the gate | up projection rounded to x's dtype,
    out[t] = sum_j w_j (h_j down_{e_j}^T) in fp32, rounded once."""
    T, H = x.shape
    P = ids.shape[1]
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for p, (e, w) in enumerate(zip(ids.flatten().tolist(), weights.flatten().tolist())):
        t = p // P
        h = silu_mul_ref(_linear_fp32(x[t:t + 1], weight_rows(gate_up, 2 * inter * e, 2 * inter)).to(x.dtype))
        out[t] += w * _linear_fp32(h, weight_rows(down, H * e, H))[0]
    return out.to(x.dtype)


@triton.jit
def _load_block(w_ptr, rows, ok, blk, blocks, K, stride_w, INT4: tl.constexpr):
    """Block blk (128 k) of weight rows `rows` [R]: the int4 words [R, 16], or the 16-bit values [R, 128]."""
    if INT4:
        w = tl.load(int4_row_words(w_ptr, rows, blocks)[:, None] + blk * 256 + tl.arange(0, 16)[None, :],
                    mask=ok[:, None], other=0)
    else:
        k = blk * 128 + tl.arange(0, 128)
        w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * stride_w + k[None, :], mask=ok[:, None] & (k[None, :] < K),
                    other=0.0)
    return w


@triton.jit
def _block_dot(w, blk, rows, ok, x_row, K, s_ptr, z_ptr, INT4: tl.constexpr, G: tl.constexpr,
               USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """[R] fp32: x[k] . W[rows, k] over the k of block blk, w its weights (_load_block), x_row one row of K."""
    R: tl.constexpr = w.shape[0]
    BM: tl.constexpr = 8                                      # x's columns: the smallest tensor-core tile
    c = tl.arange(0, BM)
    xt_cols = x_row + c[None, :] * 0                          # every column at x; the mask keeps column 0
    if INT4:
        GROUPS: tl.constexpr = 128 // G                       # groups per block
        RUNS: tl.constexpr = 4 // GROUPS                      # 32-k runs per group
        ones = tl.full((16, 32), 1.0, x_row.dtype.element_ty)
        groups = K // G
        y = tl.zeros((R, BM), tl.float32)
        for g in tl.static_range(GROUPS):
            d, xs = int4_dots(w, blk, g * RUNS, RUNS, xt_cols, c[None, :] < 1, K, ones, USE_ASM, DOT_PRECISION, R,
                               BM)
            sz = group_param_offs(rows, tl.minimum(blk * GROUPS + g, groups - 1), groups)   # (K padding: x = 0)
            s = tl.load(s_ptr + sz, mask=ok, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + sz, mask=ok, other=0.0).to(tl.float32)
            y += (16.0 * s)[:, None] * d - ((16.0 + z) * s)[:, None] * tl.max(xs, axis=0)[None, :]
    else:
        k = blk * 128 + tl.arange(0, 128)
        xt = tl.load(xt_cols + k[:, None], mask=(k[:, None] < K) & (c[None, :] < 1), other=0.0)
        y = tl.dot(w, xt, input_precision=DOT_PRECISION)
    return tl.sum(y, axis=1)                                  # column 0: the others are 0


@triton.jit(do_not_specialize=["T", "per"])   # (they change with T: one build serves every T)
def _gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, z_ptr, h_ptr, part_ptr, count_ptr, T, P, I, K, stride_x, stride_w,
                    per, INT4: tl.constexpr, G: tl.constexpr, BN: tl.constexpr,
                    USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    """h[pair, n] = silu(x_t . gate_n) * (x_t . up_n) over BN rows n of I, K blocks [per run, per (run + 1)).
    Row r of the program is gate (r even) or up (r odd) row n = n0 + r // 2 of the expert."""
    pdl.enter(PDL)
    pair = tl.program_id(0)
    tile = tl.program_id(1)
    run = tl.program_id(2)
    r = tl.arange(0, 2 * BN)
    n = tile * BN + r // 2
    ok = n < I
    rows = 2 * I * tl.load(ids_ptr + pair) + (r % 2) * I + n
    x_row = x_ptr + (pair // P).to(tl.int64) * stride_x
    blocks = tl.cdiv(K, 128)
    b0 = run * per
    b1 = tl.minimum(b0 + per, blocks)
    acc = tl.zeros((2 * BN,), tl.float32)
    ahead = _load_block(w_ptr, rows, ok, b0, blocks, K, stride_w, INT4)
    for blk in range(b0, b1):
        w = ahead
        ahead = _load_block(w_ptr, rows, ok, tl.minimum(blk + 1, b1 - 1), blocks, K, stride_w, INT4)
        tl.debug_barrier()                  # keeps the load ahead above this block's work (gemv_mma.py)
        acc += _block_dot(w, blk, rows, ok, x_row, K, s_ptr, z_ptr, INT4, G, USE_ASM, DOT_PRECISION)
    out_rows = tile * BN + tl.arange(0, BN)
    cols = pair + 0 * out_rows                # (a tensor: the interpreter cannot mask with a scalar)
    if tl.cdiv(blocks, per) == 1:
        store_swiglu(tl.reshape(acc, (BN, 2)), out_rows, cols, h_ptr, T * P, I, I)
    else:
        total, last = arrive(acc, 2 * n + r % 2, pair + 0 * r, part_ptr, count_ptr, T * P, 2 * I,
                             pair * tl.cdiv(I, BN) + tile, run, tl.cdiv(blocks, per))
        if last:
            store_swiglu(tl.reshape(total, (BN, 2)), out_rows, cols, h_ptr, T * P, I, I)


@triton.jit(do_not_specialize=["T", "per"])
def _down_kernel(h_ptr, ids_ptr, weights_ptr, w_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr, T, P, H, I,
                 stride_w, stride_out, per, INT4: tl.constexpr, G: tl.constexpr, BN: tl.constexpr,
                 USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    """out[t, n] = sum_j weights[t, j] (h[t P + j] . down_{e_j, n}) over BN rows n of H, pairs j of the run
    [per run, per (run + 1)); the work is units (pair, K block), pair-major."""
    pdl.enter(PDL)
    t = tl.program_id(0)
    tile = tl.program_id(1)
    run = tl.program_id(2)
    n = tile * BN + tl.arange(0, BN)
    ok = n < H
    blocks = tl.cdiv(I, 128)
    u0 = (t * P + run * per) * blocks
    u1 = (t * P + tl.minimum(run * per + per, P)) * blocks
    rows = H * tl.load(ids_ptr + u0 // blocks) + n
    ahead = _load_block(w_ptr, rows, ok, u0 % blocks, blocks, I, stride_w, INT4)
    y = tl.zeros((BN,), tl.float32)
    for u in range(u0, u1):
        w, w_rows = ahead, rows
        nxt = tl.minimum(u + 1, u1 - 1)
        rows = H * tl.load(ids_ptr + nxt // blocks) + n
        ahead = _load_block(w_ptr, rows, ok, nxt % blocks, blocks, I, stride_w, INT4)
        tl.debug_barrier()
        pair = u // blocks
        y += tl.load(weights_ptr + pair) * _block_dot(w, u % blocks, w_rows, ok, h_ptr + pair.to(tl.int64) * I, I,
                                                      s_ptr, z_ptr, INT4, G, USE_ASM, DOT_PRECISION)
    store_tile(y, n, t + 0 * n, out_ptr, part_ptr, count_ptr, T, H, stride_out, t * tl.cdiv(H, BN) + tile, run,
               tl.cdiv(P, per))


def _runs(programs: int, items: int, slots: int, per: int | None, floats: int) -> tuple[int, int]:
    """(runs, items per run): `items` (K blocks, pairs) of each of `programs` output tiles cut into runs so that
    there are about `slots` programs, within the split-K scratch (`floats` per run, a counter per tile). per:
    forced."""
    fits = lambda runs: runs == 1 or (runs * floats <= SPLITK_FLOATS and programs <= SPLITK_COUNTERS)  # noqa: E731
    if per is None:
        per = triton.cdiv(items, min(items, max(1, triton.cdiv(slots, programs))))
        per = per if fits(triton.cdiv(items, per)) else items
    assert fits(triton.cdiv(items, per)), "the runs' partial sums must fit the split-K scratch"
    return triton.cdiv(items, per), per


def _weight_args(w) -> tuple:
    """(words or values, scales, zeros, group size, row stride) of a weight for the kernels."""
    if isinstance(w, Int4Weight):
        return w.qweight, w.scales, w.zeros, w.group_size, 0
    return w, w, w, 128, w.stride(0)


def moe_decode(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up, down, inter: int,
               config: dict | None = None) -> torch.Tensor:
    """x [T, H], ids int32 / weights fp32 [T, P] -> [T, H] in x's dtype, two launches (the layout above). config:
    DEFAULT_CONFIG's keys, and GATE_UP_PER (K blocks per gate_up program) / DOWN_PER (pairs per down program) to
    force the splits."""
    (T, H), P, I = x.shape, ids.shape[1], inter
    out = torch.empty(T, H, dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    assert moe_decode_supports(gate_up, down), "the decode kernels take 16-bit or int4 experts"
    x = x if x.stride(-1) == 1 else x.contiguous()
    ids, weights = ids.contiguous(), weights.contiguous()
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    slots = cfg["PER_SM"] * (sm_count(x.device) if x.is_cuda else 132)
    part, count = splitk_scratch(x.device)
    common = dict(USE_ASM=not INTERPRET, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                  **pdl.launch_args(x.device))
    h = torch.empty(T * P, I, dtype=x.dtype, device=x.device)
    bn = cfg["GATE_UP_BN"]
    tiles = triton.cdiv(I, bn)
    runs, per = _runs(T * P * tiles, triton.cdiv(H, 128), slots, cfg.get("GATE_UP_PER"), T * P * 2 * I)
    w, s, z, G, stride_w = _weight_args(gate_up)
    _gate_up_kernel[(T * P, tiles, runs)](x, ids, w, s, z, h, part, count, T, P, I, H, x.stride(0), stride_w, per,
                                          INT4=isinstance(gate_up, Int4Weight), G=G, BN=bn,
                                          num_warps=cfg["GATE_UP_WARPS"], **common)
    bn = cfg["DOWN_BN"]
    tiles = triton.cdiv(H, bn)
    runs, per = _runs(T * tiles, P, slots, cfg.get("DOWN_PER"), T * H)
    w, s, z, G, stride_w = _weight_args(down)
    _down_kernel[(T, tiles, runs)](h, ids, weights, w, s, z, out, part, count, T, P, H, I, stride_w, out.stride(0),
                                   per, INT4=isinstance(down, Int4Weight), G=G, BN=bn,
                                   num_warps=cfg["DOWN_WARPS"], **common)
    return out

"""The int4 MoE decode kernels on the mma GEMV's machinery (qwendesk_kernels/gemv_mma.py): the same inline-PTX mma.sync
on the packed words, the same stream-K one-wave grid, SwiGLU in the epilogue; ops.moe_experts' path for int4 experts and
up to 8 tokens (0.92-2.2 TB/s at the 35B-A3B shape on the H200, against 0.52-0.87 for qwendesk_kernels/moe_decode.py's
tl.dot tiles: `python -m qwendesk_kernels.bench_moe`). Same signature, same torch reference (moe_decode_ref).

Slots. The mma's B operand has 8 columns: column c is token c (x rows for gate_up, h rows for down). A slot is one
expert and the tokens it serves: at T = 1 (and below GROUP_MIN_T) the slots are the pairs, each serving its own
token (column c of slot p: pair p if c is p's token); grouped, a plan kernel (one program) lists the distinct
experts in order of first use, and slot s serves every token routed to its expert (the shared expert once for all
of them; at T = 8 about 58 slots instead of 72 pairs). Plan [1 + 9 T P] int32: the slot count, each slot's expert,
then per slot the pair of each of the 8 columns (T P: that token does not use the expert). The kernels' grids are
sized for T P slots; each program reads the slot count and takes its share of the units in use (no host sync).

- gate_up (GLU): units = (slot, row group of NW warps x 16 rows of I, K block of 128); each warp a gate tile and the
  up tile I rows below of its slot's expert (rows 2 I e + n, 2 I e + I + n); h[pair] = silu(gate) * up for the
  slot's present columns, with the unfused path's roundings (gemv_mma.store_swiglu). Row groups split over
  programs: splitk.arrive (partials by pair), summed in order by the last to arrive.
- down: units = (row group of NW warps x R tiles of H, slot, K block of 128 of I): a row group's units are those of
  every slot, so a run sums over slots as over K. Column c's B operand is h of the pair (c, slot's expert); at the
  end of each slot's blocks the run adds them times the routing weight of each column's pair (nothing for a token
  without a pair there) into its sums, which are out[token, rows] summed over the token's pairs. Row groups split over
  programs: splitk's store_tile, the partials summed in order by the last to arrive (deterministic, one launch, no
  per-pair buffer).
Both wait for the kernel before them first (pdl.enter): the experts they read come from it. The configs
(MOE_MMA_CONFIG, GROUP_MIN_T included) are the best of qwendesk_kernels/bench_moe.py's sweep on the H200 (DOWN_R 1;
grouping pays from T = 4 on and is even at T = 2). The plan could come out of the routing launch
(qwendesk_kernels/moe_route.py) instead of a launch of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.gemv_mma import _block_c, _load_block_c, _load_x_c, store_swiglu
from qwendesk_kernels.quant_format import Int4Weight, group_param_offs, int4_row_words
from qwendesk_kernels.runtime import INTERPRET, sm_count
from qwendesk_kernels.splitk import SPLITK_COUNTERS, SPLITK_FLOATS, arrive, splitk_scratch, store_tile

MOE_MMA_MAX_T = 8                 # the mma's 8 columns: one token each
# NW warps per program, R 16-row tiles per warp (gate_up: its gate and up tile), PER_SM programs per SM (one wave
# of them, as gemv_mma); UNROLL and MAXNREG as gemv_mma's default; grouped slots from GROUP_MIN_T tokens on.
# PROGRAMS (not set): force the grid size of both kernels (the interpreter tests).
MOE_MMA_CONFIG = dict(GATE_UP_NW=1, GATE_UP_PER_SM=16, DOWN_NW=1, DOWN_R=1, DOWN_PER_SM=16, UNROLL=2, MAXNREG=128,
                      GROUP_MIN_T=2)


def moe_decode_mma_supports(x: torch.Tensor, gate_up, down, inter: int) -> bool:
    """int4 experts (not int8 planes) of group 64 or 128, 16-bit x of at most 8 rows, whole 16-row tiles per expert,
    and the bf16 / fp16 mma of sm_80+."""
    T, H = x.shape
    return (all(isinstance(w, Int4Weight) and w.x_repeats == 1 and w.group_size in (64, 128) for w in (gate_up, down))
            and T <= MOE_MMA_MAX_T and x.dtype in (torch.bfloat16, torch.float16) and inter % 16 == 0
            and H % 16 == 0 and (not x.is_cuda or torch.cuda.get_device_capability(x.device) >= (8, 0)))


@triton.jit
def _plan_kernel(ids_ptr, plan_ptr, T, P, NP: tl.constexpr, PDL: tl.constexpr):
    """The grouped slots (module docstring) of ids [T, P], NP >= T P a power of 2: the slots of the distinct experts
    in order of first use, each pair at column (its token) of its expert's slot."""
    pdl.enter(PDL)
    TP = T * P
    q = tl.arange(0, NP)
    e = tl.load(ids_ptr + q, mask=q < TP, other=-1)
    # [p, q] reduced over p (axis 0: mostly within each thread, in Triton's layouts)
    first = tl.min(tl.where(e[:, None] == e[None, :], q[:, None], NP), axis=0)     # the first pair of q's expert
    leads = (q < TP) & (first == q)
    slot = tl.sum((leads[:, None] & (q[:, None] < first[None, :])).to(tl.int32), axis=0)   # q's expert's slot
    tl.store(plan_ptr, tl.sum(leads.to(tl.int32), axis=0))
    tl.store(plan_ptr + 1 + slot, e, mask=leads)
    c = tl.arange(0, 8 * NP)
    tl.store(plan_ptr + 1 + TP + c, TP, mask=c < 8 * TP)                            # no pair, until ...
    tl.debug_barrier()                                  # (the fill lands before the pairs, whichever thread wrote it)
    tl.store(plan_ptr + 1 + TP + 8 * slot + q // P, q, mask=q < TP)


@triton.jit
def _slot_expert(plan_ptr, ids_ptr, slot, GROUPED: tl.constexpr):
    if GROUPED:
        e = tl.load(plan_ptr + 1 + slot)
    else:
        e = tl.load(ids_ptr + slot)
    return e


@triton.jit
def _slot_pairs(plan_ptr, slot, cols, T, P, GROUPED: tl.constexpr):
    """The pair of each token column in cols (any shape) in the slot; T P where the token has none there."""
    if GROUPED:
        pairs = tl.load(plan_ptr + 1 + T * P + 8 * slot + cols)
    else:
        pairs = tl.where(cols == slot // P, slot, T * P)
    return pairs


@triton.jit
def _weighted(a0, a1, a2, a3, plan_ptr, weights_ptr, slot, t, T, P, GROUPED: tl.constexpr):
    """A tile's sums (rows g / g + 8 x token columns 2t, 2t + 1) times the routing weights of the slot's pairs in
    those columns; 0 where the token has no pair in the slot (its B column was another pair's h: whatever it held
    must not reach this token)."""
    p0 = _slot_pairs(plan_ptr, slot, 2 * t, T, P, GROUPED)
    p1 = _slot_pairs(plan_ptr, slot, 2 * t + 1, T, P, GROUPED)
    w0 = tl.load(weights_ptr + p0, mask=p0 < T * P, other=0.0)
    w1 = tl.load(weights_ptr + p1, mask=p1 < T * P, other=0.0)
    return (tl.where(p0 < T * P, w0 * a0, 0.0), tl.where(p1 < T * P, w1 * a1, 0.0),
            tl.where(p0 < T * P, w0 * a2, 0.0), tl.where(p1 < T * P, w1 * a3, 0.0))


@triton.jit(do_not_specialize=["T"])
def _moe_mma_kernel(x_ptr, ids_ptr, weights_ptr, plan_ptr, w_ptr, s_ptr, z_ptr, y_ptr, part_ptr, count_ptr,
                    T, P, N, K, stride_x,
                    G: tl.constexpr, FP16: tl.constexpr, NW: tl.constexpr, R: tl.constexpr, UNROLL: tl.constexpr,
                    EVEN_K: tl.constexpr, GLU: tl.constexpr, GROUPED: tl.constexpr, EMULATE: tl.constexpr,
                    PDL: tl.constexpr):
    """GLU: h [T P, N = I] from x [T, K = H] and gate_up, units (slot, row group, K block); else out [T, N = H] from
    h [T P, K = I] and down, units (row group, slot, K block). The units in use are cut into runs of equal length,
    one per program (stream-K, as _gemv_mma_kernel, whose loop and fragments this is; R = 2 for GLU). A segment is
    the run's blocks of one (slot, row group); the down adds each segment into the run's sums times the routing
    weights of its columns, and stores them (or hands them to splitk) where the run leaves a row group."""
    pdl.enter(PDL)
    pid = tl.program_id(0)
    TP = T * P
    blocks = tl.cdiv(K, 128)
    groups = K // G
    if GLU:                                 # a warp's tiles: a gate tile and its up tile N rows below
        TILES: tl.constexpr = 1
        TILE1: tl.constexpr = 0
        expert_rows = 2 * N
    else:
        TILES: tl.constexpr = R  # type: ignore[no-redef]  # Triton: a constexpr per branch
        TILE1: tl.constexpr = 16  # type: ignore[no-redef]
        expert_rows = N
    rgs = tl.cdiv(N, 16 * TILES * NW)                           # row groups per expert
    if GROUPED:
        n_slots = tl.load(plan_ptr)
    else:
        n_slots = TP
    if GLU:
        tile_units = blocks                                     # the units summed into one output tile
    else:
        tile_units = n_slots * blocks
    units = n_slots * rgs * blocks
    per = tl.cdiv(units, tl.num_programs(0))
    if per > tile_units:                                        # whole tiles: no partial sums
        per = tl.cdiv(per, tile_units) * tile_units
    u = pid * per
    u_end = tl.minimum(u + per, units)
    i = tl.arange(0, 32 * NW)
    lane = i % 32
    g = lane // 4
    t = lane % 4
    j4 = tl.arange(0, 4)[None, :]
    last_tile = (N - 1) // 16 * 16                      # a tile past the expert's N rows: its last one (not stored)
    s32, z32 = s_ptr.to(tl.pointer_type(tl.int32)), z_ptr.to(tl.pointer_type(tl.int32))
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    if GLU:             # B column g: token g's x (lanes g >= T read row T - 1 again: their columns are not stored)
        x_ptrs = x32 + (tl.minimum(g, T - 1) * stride_x + 4 * t)[:, None] + j4
    MAGIC: tl.constexpr = 0x64006400 if FP16 else 0x43004300
    BIAS: tl.constexpr = 1024.0 if FP16 else 128.0
    one = tl.full((32 * NW,), 0x3C003C00 if FP16 else 0x3F803F80, tl.int32)
    zero = tl.zeros((32 * NW,), tl.float32)
    cols = tl.join(tl.join(2 * t, 2 * t + 1), tl.join(2 * t, 2 * t + 1))     # [32 NW, 2 (row g / g + 8), 2]
    y00, y01, y02, y03 = zero, zero, zero, zero          # down: the run's sums over slots (tiles 0 and 1 as a**)
    y10, y11, y12, y13 = zero, zero, zero, zero
    while u < u_end:
        seg = u // blocks
        if GLU:
            tile = seg                                          # (slot, row group): h of the slot's pairs
            slot = seg // rgs
            rg = seg % rgs
        else:
            tile = seg // n_slots                               # the row group: out of every token
            slot = seg % n_slots
            rg = tile
        b0 = u % blocks
        b1 = tl.minimum(blocks, b0 + u_end - u)
        base = _slot_expert(plan_ptr, ids_ptr, slot, GROUPED) * expert_rows
        row0 = (rg * NW + i // 32) * (16 * TILES) + g          # the lane's row g of its warp's first tile
        r0 = base + tl.minimum(row0 - g, last_tile) + g
        w0 = int4_row_words(w_ptr, r0, blocks)[:, None] + (4 * t)[:, None] + j4
        sz0 = group_param_offs(r0, 0, groups) // 2
        s0, z0 = s32 + sz0, z32 + sz0
        if R == 2:
            r1 = base + tl.minimum(row0 + TILE1 - g, last_tile) + g
            if GLU:
                r1 += N
            w1 = int4_row_words(w_ptr, r1, blocks)[:, None] + (4 * t)[:, None] + j4
            sz1 = group_param_offs(r1, 0, groups) // 2
            s1, z1 = s32 + sz1, z32 + sz1
        if not GLU:         # B column g: h of token g's pair in the slot (absent: pair 0's, not added)
            pair_g = _slot_pairs(plan_ptr, slot, g, T, P, GROUPED)
            x_ptrs = x32 + (tl.where(pair_g < TP, pair_g, 0) * stride_x + 4 * t)[:, None] + j4
        a00, a01, a02, a03 = zero, zero, zero, zero
        a10, a11, a12, a13 = zero, zero, zero, zero
        p0 = _load_block_c(w0, s0, z0, b0, groups, G)
        p1 = _load_block_c(w1, s1, z1, b0, groups, G) if R == 2 else p0
        x0, x1, x2, x3 = _load_x_c(x_ptrs, b0, K, EVEN_K, 0, False)
        for blk in tl.range(b0, b1, loop_unroll_factor=UNROLL):
            f0, f1, xs = p0, p1, (x0, x1, x2, x3)
            ahead = tl.minimum(blk + 1, b1 - 1)
            p0 = _load_block_c(w0, s0, z0, ahead, groups, G)
            p1 = _load_block_c(w1, s1, z1, ahead, groups, G) if R == 2 else p0
            x0, x1, x2, x3 = _load_x_c(x_ptrs, ahead, K, EVEN_K, 0, False)
            tl.debug_barrier()              # the loads ahead stay above this block's work (gemv_mma.py)
            a00, a01, a02, a03, a10, a11, a12, a13 = _block_c(
                f0, f1, xs, a00, a01, a02, a03, a10, a11, a12, a13, zero, one, G, FP16, R, MAGIC, BIAS, EMULATE)
        u += b1 - b0
        rows = tl.join(tl.join(row0, row0), tl.join(row0 + 8, row0 + 8))
        first = tile * tile_units // per                        # the programs with units of this output tile
        last = ((tile + 1) * tile_units - 1) // per
        if GLU:                                 # [32 NW, 2, 2, 2 (gate / up)]; partials by pair over 2N rows
            y = tl.join(tl.join(tl.join(a00, a01), tl.join(a02, a03)), tl.join(tl.join(a10, a11), tl.join(a12, a13)))
            pairs = _slot_pairs(plan_ptr, slot, cols, T, P, GROUPED)
            if first == last:
                store_swiglu(y, rows, pairs, y_ptr, TP, N, N)
            else:
                total, done = arrive(y, tl.join(rows, rows + N), tl.join(pairs, pairs), part_ptr, count_ptr, TP,
                                     2 * N, tile, pid - first, last - first + 1)
                if done:
                    store_swiglu(total, rows, pairs, y_ptr, TP, N, N)
        else:
            d00, d01, d02, d03 = _weighted(a00, a01, a02, a03, plan_ptr, weights_ptr, slot, t, T, P, GROUPED)
            y00, y01, y02, y03 = y00 + d00, y01 + d01, y02 + d02, y03 + d03
            if R == 2:
                d10, d11, d12, d13 = _weighted(a10, a11, a12, a13, plan_ptr, weights_ptr, slot, t, T, P, GROUPED)
                y10, y11, y12, y13 = y10 + d10, y11 + d11, y12 + d12, y13 + d13
            if (u % tile_units == 0) | (u == u_end):            # the run leaves this row group
                y = tl.join(tl.join(y00, y01), tl.join(y02, y03))
                out_rows, toks = rows, cols
                if R == 2:                                      # [32 NW, 2, 2, 2 (tile)]
                    y = tl.join(y, tl.join(tl.join(y10, y11), tl.join(y12, y13)))
                    out_rows, toks = tl.join(rows, rows + 16), tl.join(cols, cols)
                store_tile(y, out_rows, toks, y_ptr, part_ptr, count_ptr, T, N, N, tile, pid - first,
                           last - first + 1)
                y00, y01, y02, y03 = zero, zero, zero, zero
                y10, y11, y12, y13 = zero, zero, zero, zero


def _grid(rows: int, K: int, slots: tuple[int, int], tiles: int, nw: int, per_sm: int, programs: int | None,
          sms: int, glu: bool) -> tuple[int, int, int]:
    """(programs, row groups per expert, the most partials of one output tile) of a launch over `rows` rows per
    expert (GLU: I) and K, for any slot count between slots[0] and slots[1] (the kernel's runs follow it)."""
    blocks = triton.cdiv(K, 128)
    rgs = triton.cdiv(rows, 16 * tiles * nw)
    programs = min(programs or per_sm * sms, slots[1] * rgs * blocks)
    parts = 1
    for n in range(slots[0], slots[1] + 1):
        per = triton.cdiv(n * rgs * blocks, programs)
        tile_units = blocks if glu else n * blocks
        if per < tile_units:                    # a tile of L units meets at most cdiv(L, per) + 1 runs
            parts = max(parts, min(tile_units, triton.cdiv(tile_units, per) + 1))
    return programs, rgs, parts


def moe_mma_grids(T: int, P: int, H: int, I: int, config: dict | None, sms: int) -> tuple[int, int]:
    """(gate_up's programs, down's programs) for T tokens of P pairs (config: MOE_MMA_CONFIG's keys); asserts that
    their partial sums fit the split-K scratch whatever the slot count."""
    cfg = {**MOE_MMA_CONFIG, **(config or {})}
    TP = T * P
    slots = (P, TP) if T >= cfg["GROUP_MIN_T"] else (TP, TP)  # grouped: a token's P pairs are P distinct experts
    nw = cfg["GATE_UP_NW"]
    assert I % (16 * nw) == 0, "gate_up: whole row groups of I (a gate row past I would take an up row's partial)"
    gate_up, rgs, parts = _grid(I, H, slots, 1, nw, cfg["GATE_UP_PER_SM"], cfg.get("PROGRAMS"), sms, glu=True)
    assert parts * TP * 2 * I <= SPLITK_FLOATS and TP * rgs <= SPLITK_COUNTERS, "gate_up's partials: too many"
    down, rgs, parts = _grid(H, I, slots, cfg["DOWN_R"], cfg["DOWN_NW"], cfg["DOWN_PER_SM"], cfg.get("PROGRAMS"), sms,
                             glu=False)
    assert parts * T * H <= SPLITK_FLOATS and rgs <= SPLITK_COUNTERS, "down's partials: too many"
    return gate_up, down


def moe_decode_mma(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: Int4Weight,
                   down: Int4Weight, inter: int, config: dict | None = None) -> torch.Tensor:
    """x [T <= 8, H], ids int32 / weights fp32 [T, P] -> [T, H] in x's dtype (moe_decode_ref's math): a plan launch
    when grouped, then gate_up and down. config: MOE_MMA_CONFIG's keys (and PROGRAMS)."""
    (T, H), P, I = x.shape, ids.shape[1], inter
    out = torch.empty(T, H, dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    assert moe_decode_mma_supports(x, gate_up, down, inter), \
        "the mma MoE kernels: int4 experts of group 64 / 128, 16-bit x, T <= 8, I and H multiples of 16"
    if x.stride(0) % 2 or x.data_ptr() % 16 or x.stride(1) != 1:
        x = x.contiguous()                      # x is read as int32 pairs, 4 at a time
    ids, weights = ids.contiguous(), weights.contiguous()
    cfg = {**MOE_MMA_CONFIG, **(config or {})}
    TP = T * P
    grouped = T >= cfg["GROUP_MIN_T"]
    sms = sm_count(x.device) if x.is_cuda else 132
    gate_up_programs, down_programs = moe_mma_grids(T, P, H, I, cfg, sms)
    launch = pdl.launch_args(x.device)
    part, count = splitk_scratch(x.device)
    plan = ids
    if grouped:
        plan = torch.empty(1 + 9 * TP, dtype=torch.int32, device=x.device)
        _plan_kernel[(1,)](ids, plan, T, P, NP=max(16, triton.next_power_of_2(TP)), num_warps=4, **launch)
    if x.is_cuda and cfg.get("MAXNREG"):
        launch["maxnreg"] = cfg["MAXNREG"]
    common = dict(GROUPED=grouped, FP16=x.dtype == torch.float16, UNROLL=cfg["UNROLL"], EMULATE=INTERPRET,
                  num_stages=1, **launch)
    h = torch.empty(TP, I, dtype=x.dtype, device=x.device)
    nw = cfg["GATE_UP_NW"]
    _moe_mma_kernel[(gate_up_programs,)](x, ids, weights, plan, gate_up.qweight, gate_up.scales, gate_up.zeros, h,
                                         part, count, T, P, I, H, x.stride(0) // 2, G=gate_up.group_size, NW=nw, R=2,
                                         EVEN_K=H % 128 == 0, GLU=True, num_warps=nw, **common)
    nw = cfg["DOWN_NW"]
    _moe_mma_kernel[(down_programs,)](h, ids, weights, plan, down.qweight, down.scales, down.zeros, out, part, count,
                                      T, P, H, I, I // 2, G=down.group_size, NW=nw, R=cfg["DOWN_R"],
                                      EVEN_K=I % 128 == 0, GLU=False, num_warps=nw, **common)
    return out

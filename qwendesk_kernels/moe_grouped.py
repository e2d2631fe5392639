"""The routed experts of an MoE layer for many tokens (prefill, speculative verify): grouped GEMMs over the
(token, expert) pairs sorted by expert, with no host sync, so a CUDA graph can hold them.

out[t] = sum_j weights[t, j] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j]; pair p = t P + j.

- Alignment (two launches, _count_kernel then _place_kernel): the pairs of each expert, in pair order, padded to a
  whole number of BM-row blocks; a block -> expert map and the number of blocks actually used. The buffers have a
  size fixed by (T, P, E, BM): at most min(E, T P) experts have pairs and each wastes under BM rows, so
  max_blocks = (T P + min(E, T P) (BM - 1)) // BM. Torch could build the same with a sort, a histogram and a
  scan of fixed shapes, but that is ten or more launches, and torch.bincount learns its output size on the host.
  A program handles ALIGN_EXPERTS experts over ALIGN_SEGMENT pairs, so a long prefill spreads over the GPU and a
  verify step's few pairs cost two short launches. Padding rows hold the sentinel T P.
- GEMM 1 (_gate_up_kernel), program = (block, BN columns of I): x's rows gathered by token (pair // P), the
  expert's gate and up rows as one tile of 2 BN weight rows, silu(gate) * up into h, row for row with the sorted
  pairs (padding rows: 0). GEMM 2 (_down_kernel), program = (block, BN columns of H): h's block times the expert's
  down rows, times the pair's routing weight, written to the pair's own row. A program past the blocks in use
  reads one int32 and exits: the grid is the bound, the work what the routing made.
- The per-token sum over P of the pairs' rows is torch's (one launch; fp32 accumulation, no atomics: the same
  bits every run).
- Int4 weights go through the dot GEMV's K loop (qwendesk_kernels/gemv_dot.py dot_tile: the packed words are the tensor
  cores' A operand, sum_k x by a dot with ones, per-group scale and zero once per output), so there is one
  dequantisation in the tree; 16-bit weights are a plain tl.dot GEMM with x as A. Roundings are the unfused
  path's (a linear's output in the activation dtype, then SwiGLU as qwendesk_kernels/activation.py, the expert's output
  rounded before the routing weight), so moe_grouped_ref below is a loop over experts of the ordinary ops.
- Configs: a fixed one per BM (chosen from the mean pairs per expert), no autotuner: nothing to tune inside a
  graph capture, and each BM compiles once (warm_up_tokens: token counts that reach every BM).
Workspace: h [max_blocks BM, I] and the pairs' rows [T P, H] in the activation dtype (workspace_bytes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.activation import silu_mul_ref
from qwendesk_kernels.gemv_dot import dot_tile
from qwendesk_kernels.quant_format import Int4Weight, int4_linear_ref, weight_rows
from qwendesk_kernels.runtime import INTERPRET

ALIGN_EXPERTS = 16        # experts per program of the alignment kernels
ALIGN_SEGMENT = 4096      # pairs per program of the alignment kernels
ALIGN_CHUNK = 256         # pairs per step inside one: a [ALIGN_CHUNK, ALIGN_EXPERTS] tile
BLOCK_MS = (16, 32, 64, 128)


# ---------------------------------------------------------------------------------------------------------------
# torch references

def _linear_ref(x: torch.Tensor, w: torch.Tensor | Int4Weight) -> torch.Tensor:
    if isinstance(w, Int4Weight):
        return int4_linear_ref(x, w)
    return (x.float() @ w.float().t()).to(x.dtype)


def moe_grouped_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up, down,
                    inter: int) -> torch.Tensor:
    """The same sum, one expert at a time (host syncs: the test oracle and the CPU path)."""
    T, P = ids.shape
    H = x.shape[1]
    pairs = torch.zeros(T, P, H, dtype=x.dtype, device=x.device)
    for e in torch.unique(ids).tolist():
        t, j = (ids == e).nonzero(as_tuple=True)
        h = silu_mul_ref(_linear_ref(x[t], weight_rows(gate_up, 2 * inter * e, 2 * inter)))
        y = _linear_ref(h, weight_rows(down, H * e, H))
        pairs[t, j] = (y.float() * weights[t, j, None].float()).to(x.dtype)
    return pairs.float().sum(1).to(x.dtype)


def moe_align_ref(ids: torch.Tensor, num_experts: int, BM: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """-> (sorted pairs padded per expert to whole BM blocks, sentinel T P; the expert of each block; the number
    of blocks): what _count_kernel and _place_kernel write, for the blocks in use."""
    flat = ids.flatten().long()
    n = flat.numel()
    slots, experts = [], []
    for e in range(num_experts):
        mine = (flat == e).nonzero().flatten()
        blocks = -(-mine.numel() // BM)
        slots.append(torch.cat([mine, torch.full((blocks * BM - mine.numel(),), n, device=ids.device)]))
        experts += [e] * blocks
    return (torch.cat(slots).to(torch.int32), torch.tensor(experts, dtype=torch.int32, device=ids.device),
            len(experts))


# ---------------------------------------------------------------------------------------------------------------
# alignment

@triton.jit(do_not_specialize=["n"])
def _count_kernel(ids_ptr, counts_ptr, n, E, SEGMENT: tl.constexpr, CHUNK: tl.constexpr, EB: tl.constexpr,
                  PDL: tl.constexpr):
    """counts[s, e] = pairs of expert e in segment s, for this program's EB experts."""
    pdl.enter(PDL)
    e = tl.program_id(0) * EB + tl.arange(0, EB)
    s = tl.program_id(1)
    count = tl.zeros((EB,), tl.int32)
    for i in range(s * SEGMENT, tl.minimum(s * SEGMENT + SEGMENT, n), CHUNK):
        p = i + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + p, mask=p < n, other=-1)
        count += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + s * E + e, count, mask=e < E)


@triton.jit(do_not_specialize=["n", "segments"])
def _place_kernel(ids_ptr, counts_ptr, pairs_ptr, block_expert_ptr, num_blocks_ptr, n, E, segments,
                  BM: tl.constexpr, SEGMENT: tl.constexpr, CHUNK: tl.constexpr, EB: tl.constexpr,
                  E_P: tl.constexpr, PDL: tl.constexpr):
    """Writes the pairs of this program's EB experts in segment s at their slots (in pair order); segment 0's
    programs also write the experts' padding slots and block map, and program (0, 0) the number of blocks."""
    pdl.enter(PDL)
    e0 = tl.program_id(0) * EB
    e = e0 + tl.arange(0, EB)
    s = tl.program_id(1)
    every = tl.arange(0, E_P)
    total = tl.zeros((E_P,), tl.int32)                      # pairs per expert, all experts
    before = tl.zeros((EB,), tl.int32)                      # this program's experts' pairs in segments < s
    for ss in range(0, segments):
        total += tl.load(counts_ptr + ss * E + every, mask=every < E, other=0)
    for ss in range(0, s):
        before += tl.load(counts_ptr + ss * E + e, mask=e < E, other=0)
    blocks = (total + BM - 1) // BM
    first = tl.sum(tl.where(every[None, :] < e[:, None], blocks[None, :], 0), axis=1)      # [EB]: first block
    pos = first * BM + before
    for i in range(s * SEGMENT, tl.minimum(s * SEGMENT + SEGMENT, n), CHUNK):
        p = i + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + p, mask=p < n, other=-1)
        hit = (ids[:, None] == e[None, :]).to(tl.int32)                                 # [CHUNK, EB]
        rank = tl.cumsum(hit, axis=0) - hit
        tl.store(pairs_ptr + pos[None, :] + rank, tl.broadcast_to(p[:, None], (CHUNK, EB)), mask=hit != 0)
        pos += tl.sum(hit, axis=0)
    if s == 0:
        mine = tl.sum(tl.where(every[None, :] == e[:, None], total[None, :], 0), axis=1)     # [EB]
        end = first + (mine + BM - 1) // BM
        pad = (first * BM + mine)[:, None] + tl.arange(0, BM)[None, :]
        tl.store(pairs_ptr + pad, tl.full((EB, BM), 0, tl.int32) + n, mask=pad < end[:, None] * BM)
        lo = tl.min(first, axis=0)
        hi = tl.max(tl.where(e < E, end, 0), axis=0)
        for b0 in range(lo, hi, 128):
            b = b0 + tl.arange(0, 128)
            expert = e0 + tl.sum((end[None, :] <= b[:, None]).to(tl.int32), axis=1)
            tl.store(block_expert_ptr + b, expert, mask=b < hi)
        if e0 == 0:
            tl.store(num_blocks_ptr, tl.sum(blocks, axis=0))


def max_blocks(n_pairs: int, num_experts: int, BM: int) -> int:
    """Blocks of BM sorted pairs at most, however the pairs fall: each expert with pairs wastes < BM rows."""
    return (n_pairs + min(num_experts, n_pairs) * (BM - 1)) // BM


def moe_align(ids: torch.Tensor, num_experts: int, BM: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [T, P] int32 (each in [0, num_experts)) -> (pairs int32 [max_blocks BM]: the pair indices sorted by
    expert, each expert's run padded to whole blocks with T P; block_expert int32 [max_blocks]; num_blocks int32 [1]:
    the blocks in use). Entries past the blocks in use are not written."""
    n = ids.numel()
    flat = ids.reshape(-1)
    segments = triton.cdiv(n, ALIGN_SEGMENT)
    nb = max_blocks(n, num_experts, BM)
    counts = torch.empty(segments, num_experts, dtype=torch.int32, device=ids.device)
    pairs = torch.empty(nb * BM, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(nb, dtype=torch.int32, device=ids.device)
    num_blocks = torch.empty(1, dtype=torch.int32, device=ids.device)
    grid = (triton.cdiv(num_experts, ALIGN_EXPERTS), segments)
    common = dict(SEGMENT=ALIGN_SEGMENT, CHUNK=ALIGN_CHUNK, EB=ALIGN_EXPERTS, num_warps=4,
                  **pdl.launch_args(ids.device))
    _count_kernel[grid](flat, counts, n, num_experts, **common)
    _place_kernel[grid](flat, counts, pairs, block_expert, num_blocks, n, num_experts, segments, BM=BM,
                        E_P=triton.next_power_of_2(num_experts), **common)
    return pairs, block_expert, num_blocks


# ---------------------------------------------------------------------------------------------------------------
# grouped GEMMs

@triton.jit
def _block_rows(pairs_ptr, block_expert_ptr, b, n, BM: tl.constexpr):
    """Block b's expert, its slots, their pairs and which slots hold one."""
    slot = b * BM + tl.arange(0, BM)
    pair = tl.load(pairs_ptr + slot)
    return tl.load(block_expert_ptr + b), slot.to(tl.int64), pair, pair < n


@triton.jit(do_not_specialize=["n"])
def _gate_up_kernel(x_ptr, w_ptr, s_ptr, z_ptr, pairs_ptr, block_expert_ptr, num_blocks_ptr, h_ptr,
                    n, H, I, stride_x, stride_w, P: tl.constexpr, INT4: tl.constexpr, G: tl.constexpr,
                    USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    BK: tl.constexpr, PDL: tl.constexpr):
    """h[slots of block b, BN columns] = silu(x gate^T) * (x up^T) of the block's expert, x gathered by token."""
    pdl.enter(PDL)
    b = tl.program_id(0)
    if b >= tl.load(num_blocks_ptr):
        return
    e, slot, pair, ok = _block_rows(pairs_ptr, block_expert_ptr, b, n, BM)
    token = (pair // P).to(tl.int64)
    c = tl.arange(0, 2 * BN)
    col = tl.program_id(1) * BN + c % BN
    rows = 2 * I * e + col + (c // BN) * I                    # BN gate rows, then the same BN up rows
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    if INT4:
        acc = dot_tile(x_ptr + token[None, :] * stride_x, ok[None, :], w_ptr, s_ptr, z_ptr, rows, col < I,
                       0, tl.cdiv(H, 128), H, 4, G, USE_ASM, DOT_PRECISION, 2 * BN, BM)     # [2 BN, BM]
        gate, up = tl.split(tl.permute(tl.reshape(acc, (2, BN, BM)), (1, 2, 0)))              # [BN, BM]
        h_ptrs = h_ptr + slot[None, :] * I + cols[:, None]
        h_mask = cols[:, None] < I
    else:
        acc = tl.zeros((BM, 2 * BN), tl.float32)
        for k0 in range(0, H, BK):
            k = k0 + tl.arange(0, BK)
            xk = tl.load(x_ptr + token[:, None] * stride_x + k[None, :], mask=ok[:, None] & (k[None, :] < H),
                         other=0.0)
            wk = tl.load(w_ptr + rows.to(tl.int64)[:, None] * stride_w + k[None, :],
                         mask=(col < I)[:, None] & (k[None, :] < H), other=0.0)
            acc = tl.dot(xk, tl.trans(wk), acc, input_precision=DOT_PRECISION)
        gate, up = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN)), (0, 2, 1)))              # [BM, BN]
        h_ptrs = h_ptr + slot[:, None] * I + cols[None, :]
        h_mask = cols[None, :] < I
    dtype = h_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)                      # the projection's output, then activation.py
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(h_ptrs, (silu * up.to(dtype).to(tl.float32)).to(dtype), mask=h_mask)


@triton.jit(do_not_specialize=["n"])
def _down_kernel(h_ptr, w_ptr, s_ptr, z_ptr, pairs_ptr, block_expert_ptr, num_blocks_ptr, weights_ptr, y_ptr,
                 n, H, I, stride_w, INT4: tl.constexpr, G: tl.constexpr, USE_ASM: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 PDL: tl.constexpr):
    """y[pair, BN columns] = weight of the pair * (h[slot] down^T) of block b's expert, for the block's pairs."""
    pdl.enter(PDL)
    b = tl.program_id(0)
    if b >= tl.load(num_blocks_ptr):
        return
    e, slot, pair, ok = _block_rows(pairs_ptr, block_expert_ptr, b, n, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    rows = H * e + cols
    if INT4:
        acc = tl.trans(dot_tile(h_ptr + slot[None, :] * I, ok[None, :], w_ptr, s_ptr, z_ptr, rows, cols < H,
                                0, tl.cdiv(I, 128), I, 4, G, USE_ASM, DOT_PRECISION, BN, BM))   # [BM, BN]
    else:
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, I, BK):
            k = k0 + tl.arange(0, BK)
            hk = tl.load(h_ptr + slot[:, None] * I + k[None, :], mask=ok[:, None] & (k[None, :] < I), other=0.0)
            wk = tl.load(w_ptr + rows.to(tl.int64)[:, None] * stride_w + k[None, :],
                         mask=(cols < H)[:, None] & (k[None, :] < I), other=0.0)
            acc = tl.dot(hk, tl.trans(wk), acc, input_precision=DOT_PRECISION)
    dtype = y_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + pair, mask=ok, other=0.0)
    out = (acc.to(dtype).to(tl.float32) * weight[:, None]).to(dtype)
    tl.store(y_ptr + pair.to(tl.int64)[:, None] * H + cols[None, :], out, mask=ok[:, None] & (cols[None, :] < H))


# ---------------------------------------------------------------------------------------------------------------
# configs and launch

def default_config(n_pairs: int, num_experts: int, int4: bool) -> dict:
    """BM from the mean pairs per expert (an expert's last block is half empty on average: BM up to half the mean),
    BN_UP columns of I (2 BN_UP weight rows of gate | up per program), BN_DOWN columns of H; warps and stages. Not
    yet tuned on a GPU (qwendesk_kernels/bench_moe_grouped.py --sweep measures the alternatives)."""
    mean = n_pairs / num_experts
    BM = next((bm for bm in BLOCK_MS[:-1] if mean < 2 * bm), BLOCK_MS[-1])
    return dict(BM=BM, BN_UP=64, BN_DOWN=128, BK=64, WARPS=8 if BM == 128 else 4, STAGES=2 if int4 else 3)


def warm_up_tokens(P: int, num_experts: int, max_tokens: int) -> tuple[int, ...]:
    """The fewest tokens that reach each BM of default_config, up to max_tokens (a prefill step's): the engine runs
    them before serving, as it does quant.WARM_UP_ROWS, else a first use compiles for seconds (in a graph capture
    or a request). Token counts do not specialise the kernels (do_not_specialize)."""
    first = [1] + [-(-bm * num_experts // P) for bm in BLOCK_MS[1:]]
    return tuple(t for t in first if t <= max_tokens)


def workspace_bytes(T: int, P: int, num_experts: int, hidden: int, inter: int, itemsize: int, BM: int = 128) -> int:
    """Device memory moe_grouped_triton allocates for T tokens besides its output, at block size BM (the default,
    the largest, bounds every config): h, the pairs' rows, and the alignment's int32 buffers."""
    n = T * P
    rows = max_blocks(n, num_experts, BM) * BM
    return rows * inter * itemsize + n * hidden * itemsize + 4 * (rows + rows // BM + 1) + 4 * num_experts * (
        -(-n // ALIGN_SEGMENT))


def _weight_args(w: torch.Tensor | Int4Weight) -> tuple:
    """(words or weight, scales, zeros, group size, row stride) of a stacked expert weight."""
    if isinstance(w, Int4Weight):
        assert w.x_repeats == 1, "int8 experts take the torch path"
        return w.qweight, w.scales, w.zeros, w.group_size, 0
    assert w.stride(1) == 1, "16-bit expert weights with contiguous rows"
    return w, w, w, 0, w.stride(0)


def moe_grouped_triton(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up, down, inter: int,
                       config: dict | None = None) -> torch.Tensor:
    """x [T, H], ids [T, P] int32 in [0, E), weights [T, P] fp32; gate_up [2 I E, H] and down [H E, I], both
    Int4Weight or both 16-bit tensors -> [T, H] in x's dtype. config: see default_config (None: the default)."""
    T, P = ids.shape
    H = x.shape[1]
    int4 = isinstance(gate_up, Int4Weight)
    E = gate_up.shape[0] // (2 * inter)
    assert int4 == isinstance(down, Int4Weight), "gate_up and down: both int4 or both 16-bit"
    assert tuple(gate_up.shape) == (2 * inter * E, H) and tuple(down.shape) == (H * E, inter), "stacked experts"
    assert not int4 or (inter % 8 == 0 and H % 16 == 0), "int4 experts start on 16-row tiles"
    assert int4 or gate_up.dtype == down.dtype == x.dtype, "16-bit experts in the activation dtype"
    n = T * P
    if n == 0:
        return x.new_zeros(T, H)
    cfg = config or default_config(n, E, int4)
    BM = cfg["BM"]
    x = x if x.stride(1) == 1 else x.contiguous()
    ids = ids.to(torch.int32).contiguous()
    weights = weights.float().contiguous()
    pairs, block_expert, num_blocks = moe_align(ids, E, BM)
    blocks = block_expert.shape[0]
    common = dict(INT4=int4, USE_ASM=not INTERPRET, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                  BM=BM, BK=cfg["BK"], num_warps=cfg["WARPS"], num_stages=cfg["STAGES"], **pdl.launch_args(x.device))
    h = torch.empty(blocks * BM, inter, dtype=x.dtype, device=x.device)
    w, s, z, G, stride = _weight_args(gate_up)
    _gate_up_kernel[(blocks, triton.cdiv(inter, cfg["BN_UP"]))](
        x, w, s, z, pairs, block_expert, num_blocks, h, n, H, inter, x.stride(0), stride, P=P, G=G,
        BN=cfg["BN_UP"], **common)
    y = torch.empty(n, H, dtype=x.dtype, device=x.device)
    w, s, z, G, stride = _weight_args(down)
    _down_kernel[(blocks, triton.cdiv(H, cfg["BN_DOWN"]))](
        h, w, s, z, pairs, block_expert, num_blocks, weights, y, n, H, inter, stride, G=G, BN=cfg["BN_DOWN"],
        **common)
    return y.view(T, P, H).sum(1)


def moe_grouped(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up, down, inter: int) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) for x [T, H]. CUDA: the grouped Triton kernels (no host sync,
    capturable once each BM has run: warm_up_tokens); elsewhere the torch reference."""
    if x.is_cuda:
        return moe_grouped_triton(x, ids, weights, gate_up, down, inter)
    return moe_grouped_ref(x, ids, weights, gate_up, down, inter)

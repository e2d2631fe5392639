"""MoE routing: router logits -> each token's (expert id, weight) pairs, in one launch.

logits [T, E] (or [T, E + 1], the shared expert's gate logit last) -> ids int32 [T, P], weights fp32 [T, P], pair
p = t P + j (qwendesk_kernels/moe_decode.py reads them so). The routed pairs: a float32 softmax over the E experts, the k
largest (ties: the lower expert id first), renormalised to sum to 1 and rounded to the logits' dtype (what the
model multiplies by: transformers' Qwen3_5MoeSparseMoeBlock). With `shared`, P = k + 1 and the last pair is the
shared expert, stored as expert E, weighted by sigmoid(its gate logit), rounded the same way.

moe_router_route_triton does the router's GEMV too, for decode steps (T <= ROUTER_ROUTE_MAX_T) of a 16-bit router:
one launch instead of cuBLAS's GEMV (which also waits for the whole kernel before it: no PDL) and the routing one,
12% of the 35B-A3B's C1 step (docs/performance.md). It is tested here against the references but not yet the
model's path (engine/model/moe.py): that waits for its time on the GPU (qwendesk_kernels/bench_moe.py measures both).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.splitk import splitk_scratch

ROUTER_ROUTE_MAX_T = 8          # decode steps; prefill's router is one cuBLAS GEMM
ROUTER_ROUTE_MAX_H = 8192


def moe_route_ref(logits: torch.Tensor, top_k: int, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (ids int32 [T, P], weights fp32 [T, P]): top k of the softmax by a stable sort (ties to the lower id)."""
    E = logits.shape[1] - shared
    probs = torch.softmax(logits[:, :E].float(), dim=-1)
    top, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, ids = top[:, :top_k], ids[:, :top_k]
    weights = (top / top.sum(dim=-1, keepdim=True)).to(logits.dtype)
    if shared:
        ids = torch.cat([ids, torch.full_like(ids[:, :1], E)], dim=1)
        weights = torch.cat([weights, torch.sigmoid(logits[:, E:])], dim=1)
    return ids.to(torch.int32), weights.float()


@triton.jit
def _route_token(logits_ptr, ids_ptr, weights_ptr, t, E, stride_l, K: tl.constexpr, SHARED: tl.constexpr,
                 BE: tl.constexpr, BP: tl.constexpr, dtype: tl.constexpr):
    """Route token t of logits [T, stride_l] (read through L2: another program may have written them). The k picks
    are k argmaxes over the logits (the softmax keeps their order; argmax takes the lowest index of a tie), each
    taken out of the running after it is picked."""
    e = tl.arange(0, BE)
    logits = tl.load(logits_ptr + t * stride_l + e, mask=e < E, other=-float("inf"),
                     cache_modifier=".cg").to(tl.float32)
    num = tl.exp(logits - tl.max(logits, axis=0))
    probs = num / tl.sum(num, axis=0)
    j = tl.arange(0, BP)
    ids = tl.zeros((BP,), tl.int32)
    top = tl.zeros((BP,), tl.float32)
    left = logits
    for i in tl.static_range(K):
        best = tl.argmax(left, axis=0, tie_break_left=True)
        ids = tl.where(j == i, best, ids)
        top = tl.where(j == i, tl.sum(tl.where(e == best, probs, 0.0), axis=0), top)
        left = tl.where(e == best, -float("inf"), left)
    weights = (top / tl.sum(top, axis=0)).to(dtype).to(tl.float32)
    P: tl.constexpr = K + SHARED
    if SHARED:
        gate = tl.load(logits_ptr + t * stride_l + E, cache_modifier=".cg").to(tl.float32)
        ids = tl.where(j == K, E, ids)
        weights = tl.where(j == K, (1.0 / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32), weights)
    tl.store(ids_ptr + t * P + j, ids, mask=j < P)
    tl.store(weights_ptr + t * P + j, weights, mask=j < P)


@triton.jit
def _route_kernel(logits_ptr, ids_ptr, weights_ptr, E, stride_l, K: tl.constexpr, SHARED: tl.constexpr,
                  BE: tl.constexpr, BP: tl.constexpr, PDL: tl.constexpr):
    """One token per program."""
    pdl.enter(PDL)
    _route_token(logits_ptr, ids_ptr, weights_ptr, tl.program_id(0).to(tl.int64), E, stride_l, K, SHARED, BE, BP,
                 logits_ptr.dtype.element_ty)


@triton.jit
def _router_route_kernel(x_ptr, w_ptr, logits_ptr, count_ptr, ids_ptr, weights_ptr, T, N, H, stride_x,
                         K: tl.constexpr, SHARED: tl.constexpr, BN: tl.constexpr, BH: tl.constexpr,
                         BE: tl.constexpr, BP: tl.constexpr, PDL: tl.constexpr):
    """Program n: router rows [n BN, n BN + BN) for every token, rounded to x's dtype (what F.linear returns), into
    logits [T, N] fp32. Its weights are loaded before it waits for the kernel before (they do not depend on it).
    The last program to arrive at the counter routes every token and resets the counter (qwendesk_kernels/splitk.py's
    arrival)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    h = tl.arange(0, BH)
    w = tl.load(w_ptr + rows[:, None] * H + h[None, :], mask=(rows[:, None] < N) & (h[None, :] < H), other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    dtype = x_ptr.dtype.element_ty
    for t in range(T):
        x = tl.load(x_ptr + t * stride_x + h, mask=h < H, other=0.0)
        y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(logits_ptr + t * N + rows, y.to(dtype).to(tl.float32), mask=rows < N)
    tl.debug_barrier()                      # every thread's logits are written before the release below
    if tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        for t in range(T):
            _route_token(logits_ptr, ids_ptr, weights_ptr, t, N - SHARED, N, K, SHARED, BE, BP, dtype)
        tl.atomic_xchg(count_ptr, 0)


def moe_route_triton(logits: torch.Tensor, top_k: int, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
    T, E = logits.shape[0], logits.shape[1] - shared
    P = top_k + shared
    ids = torch.empty(T, P, dtype=torch.int32, device=logits.device)
    weights = torch.empty(T, P, dtype=torch.float32, device=logits.device)
    if T:
        logits = logits if logits.stride(-1) == 1 else logits.contiguous()
        _route_kernel[(T,)](logits, ids, weights, E, logits.stride(0), K=top_k, SHARED=shared,
                            BE=triton.next_power_of_2(E), BP=triton.next_power_of_2(P), num_warps=4,
                            **pdl.launch_args(logits.device))
    return ids, weights


def moe_route(logits: torch.Tensor, top_k: int, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E (+ 1 with shared)] -> (ids int32 [T, P], weights fp32 [T, P]). CUDA: one launch, any T
    (graph-capturable); elsewhere the torch reference."""
    return moe_route_triton(logits, top_k, shared) if logits.is_cuda else moe_route_ref(logits, top_k, shared)


def moe_router_route_supports(x: torch.Tensor, router) -> bool:
    """A decode step's 16-bit x and 16-bit router [N, H] of the same dtype (contiguous rows), H <= 8192."""
    return (isinstance(router, torch.Tensor) and x.dtype == router.dtype and x.dtype != torch.float32
            and x.shape[0] <= ROUTER_ROUTE_MAX_T and x.shape[1] <= ROUTER_ROUTE_MAX_H and router.stride(1) == 1
            and router.stride(0) == router.shape[1] and x.stride(1) == 1)


def moe_router_route_triton(x: torch.Tensor, router: torch.Tensor, top_k: int,
                            shared: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T <= 8, H], router [E (+ 1), H] -> (ids, weights, the logits fp32 [T, E (+ 1)] rounded to x's dtype),
    in one launch."""
    (T, H), N = x.shape, router.shape[0]
    P = top_k + shared
    ids = torch.empty(T, P, dtype=torch.int32, device=x.device)
    weights = torch.empty(T, P, dtype=torch.float32, device=x.device)
    logits = torch.empty(T, N, dtype=torch.float32, device=x.device)
    if T:
        assert moe_router_route_supports(x, router), "the fused router: 16-bit x and router, T <= 8, H <= 8192"
        BH = triton.next_power_of_2(H)
        BN = min(triton.next_power_of_2(triton.cdiv(N, 64)), max(1, 8192 // BH))   # ~64 programs, <= 8K weights each
        count = splitk_scratch(x.device)[1]     # its first counter: every kernel before has reset its own
        _router_route_kernel[(triton.cdiv(N, BN),)](
            x, router, logits, count, ids, weights, T, N, H, x.stride(0), K=top_k, SHARED=shared, BN=BN, BH=BH,
            BE=triton.next_power_of_2(N - shared), BP=triton.next_power_of_2(P),
            num_warps=4, **pdl.launch_args(x.device))
    return ids, weights, logits

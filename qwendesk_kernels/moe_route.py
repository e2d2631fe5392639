"""MoE routing: router logits -> each token's (expert id, weight) pairs, in one launch.

logits [T, E] (or [T, E + 1], the shared expert's gate logit last) -> ids int32 [T, P], weights fp32 [T, P], pair
p = t P + j (qwendesk_kernels/moe_decode.py reads them so). The routed pairs: a float32 softmax over the E experts, the
k largest (ties: the lower expert id first), renormalised to sum to 1 and rounded to the logits' dtype (what the
model multiplies by: transformers' Qwen3_5MoeSparseMoeBlock). With `shared`, P = k + 1 and the last pair is the
shared expert, stored as expert E, weighted by sigmoid(its gate logit), rounded the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl


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
def _route_kernel(logits_ptr, ids_ptr, weights_ptr, E, stride_l, K: tl.constexpr, SHARED: tl.constexpr,
                  BE: tl.constexpr, BP: tl.constexpr, PDL: tl.constexpr):
    """One token per program. The k picks are k argmaxes over the logits (the softmax keeps their order; argmax
    takes the lowest index of a tie), each taken out of the running after it is picked."""
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    dtype = logits_ptr.dtype.element_ty
    e = tl.arange(0, BE)
    logits = tl.load(logits_ptr + t * stride_l + e, mask=e < E, other=-float("inf")).to(tl.float32)
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
        gate = tl.load(logits_ptr + t * stride_l + E).to(tl.float32)
        ids = tl.where(j == K, E, ids)
        weights = tl.where(j == K, (1.0 / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32), weights)
    tl.store(ids_ptr + t * P + j, ids, mask=j < P)
    tl.store(weights_ptr + t * P + j, weights, mask=j < P)


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

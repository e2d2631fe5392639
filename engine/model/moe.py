"""The sparse mixture-of-experts MLP of the qwen3_5_moe models (transformers' Qwen3_5MoeSparseMoeBlock).

Each token's router logits (x W_router^T, in the activation dtype) go through a float32 softmax over the experts;
the top k probabilities are renormalised to sum to 1 and weight the chosen experts' SwiGLU outputs. A shared expert
(a SwiGLU MLP every token goes through) is added, scaled by sigmoid(x w_gate). Ties in the router's probabilities
go to the lower expert index (a stable sort), so any device and any future kernel choose the same experts.

The experts' weights are two stacked Linears, so each expert is a block of rows that int4 / int8 hold like any
other linear (the policy quantizes each checkpoint expert tensor on its own): `gate_up` holds expert e's gate | up
rows at [2 I e, 2 I (e + 1)), `down` its down rows at [H e, H (e + 1)). The torch path here sorts the token-expert
pairs by expert and runs one GEMM (at decode one GEMV) per expert that has tokens, reading only those experts'
weights. It learns how many tokens each expert has from the device (a host sync): not capturable in a CUDA graph,
so the engine runs MoE models without decode graphs (engine/engine.py).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.model.linear import Build, Linear
from kernels import ops
from kernels.quant_format import Int4Weight


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64): float32 softmax, the
    k largest probabilities (ties: the lower expert id first), renormalised."""
    probs = torch.softmax(logits.float(), dim=-1)
    top, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, ids = top[:, :top_k], ids[:, :top_k]
    return (top / top.sum(dim=-1, keepdim=True)).to(logits.dtype), ids


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, build: Build, prefix: str, shared_expert: nn.Module):
        """shared_expert: the SwiGLU MLP under `{prefix}shared_expert.` (engine/model/layers.MLP)."""
        super().__init__()
        E, I, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.num_experts, self.top_k, self.inter, self.hidden = E, cfg.num_experts_per_tok, I, H
        self.router = Linear(H, {"gate": E}, build, prefix)
        self.shared_expert = shared_expert
        self.shared_gate = Linear(H, {"shared_expert_gate": 1}, build, prefix)
        self.gate_up = Linear(H, {f"experts.{e}.{p}": I for e in range(E) for p in ("gate_proj", "up_proj")},
                              build, prefix)
        self.down = Linear(I, {f"experts.{e}.down_proj": H for e in range(E)}, build, prefix)
        if self.gate_up.int4_tiles and (2 * I % 16 or H % 16):
            raise ValueError(f"quantized experts need 2 * moe_intermediate_size ({2 * I}) and hidden_size ({H}) in "
                             f"whole 16-row tiles")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.router(x), self.top_k)
        shared = self.shared_expert(x) * torch.sigmoid(self.shared_gate(x))
        return self.routed(x, ids, weights) + shared

    def routed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum over j of weights[t, j] * expert_{ids[t, j]}(x[t]), for x [T, H]: the pairs sorted by expert, one
        matmul per expert with tokens, the weighted outputs added back into their tokens' rows."""
        k = ids.shape[1]
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        tokens = order // k                                        # the token of each sorted pair
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()     # the host sync
        xs = x[tokens]
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                out[start:start + n] = self.expert(xs[start:start + n], e)
                start += n
        out *= weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, tokens, out)

    def expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """Expert e's SwiGLU MLP on rows x [n, H]."""
        gate_up = self.gate_up.rows(2 * self.inter * e, 2 * self.inter)
        if isinstance(gate_up, Int4Weight):
            h = ops.int4_swiglu(x, gate_up)
        else:
            h = ops.silu_mul(ops.matmul(x, gate_up))
        return ops.matmul(h, self.down.rows(self.hidden * e, self.hidden))

    def checkpoint_slices(self):
        yield from self.router.checkpoint_slices()
        yield from self.shared_gate.checkpoint_slices()
        yield from self.shared_expert.checkpoint_slices()
        yield from self.gate_up.checkpoint_slices()
        yield from self.down.checkpoint_slices()

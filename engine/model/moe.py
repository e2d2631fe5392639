"""The sparse mixture-of-experts MLP of the qwen3_5_moe models (transformers' Qwen3_5MoeSparseMoeBlock).

Each token's router logits (x W_router^T, in the activation dtype) go through a float32 softmax over the experts;
the top k probabilities are renormalised to sum to 1 and weight the chosen experts' SwiGLU outputs. A shared expert
(a SwiGLU MLP every token goes through) is added, scaled by sigmoid(x w_gate). Ties in the router's probabilities
go to the lower expert index, so every device and kernel choose the same experts.

The experts' weights are two stacked Linears, so each expert is a block of rows that int4 / int8 hold like any
other linear (the policy quantizes each checkpoint expert tensor on its own): `gate_up` holds expert e's gate | up
rows at [2 I e, 2 I (e + 1)), `down` its down rows at [H e, H (e + 1)). When the shared expert has the routed
experts' shape (the 35B-A3B: both 512 wide), it is stacked after them as expert E, its gate is the router's last
row, and routing gives every token k + 1 pairs, the last (E, sigmoid(gate)): one routed path runs it. Else it is an
MLP of its own.

The routed path is qwendesk_kernels/ops.moe_route + moe_experts: for 16-bit or int4 experts, steps of up to
MOE_DECODE_MAX_T tokens run the decode kernels (qwendesk_kernels/moe_decode.py), which read only the chosen experts'
weights, and larger steps the grouped kernels (qwendesk_kernels/moe_grouped.py), neither with a host sync, so the engine
captures MoE models' decode steps in CUDA graphs. Int8 experts take a torch loop that learns each expert's token count
on the host: the engine runs a model with int8 experts without CUDA graphs (engine/core/build.py).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.model.linear import Build, Linear
from qwendesk_kernels import ops


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, build: Build, prefix: str, shared_expert: nn.Module | None):
        """shared_expert: the SwiGLU MLP under `{prefix}shared_expert.` (engine/model/layers.MLP), None when it is
        expert E (cfg.shared_expert_stacked)."""
        super().__init__()
        E, I, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        assert (shared_expert is None) == cfg.shared_expert_stacked
        self.num_experts, self.top_k, self.inter, self.hidden = E, cfg.num_experts_per_tok, I, H
        self.shared_expert = shared_expert
        experts = [f"experts.{e}." for e in range(E)]
        self.pairs = self.top_k                        # (token, expert) pairs per token
        if shared_expert is None:
            experts.append("shared_expert.")
            self.pairs += 1
            self.router = Linear(H, {"gate": E, "shared_expert_gate": 1}, build, prefix)
        else:
            self.router = Linear(H, {"gate": E}, build, prefix)
            self.shared_gate = Linear(H, {"shared_expert_gate": 1}, build, prefix)
        self.gate_up = Linear(H, {f"{n}{p}": I for n in experts for p in ("gate_proj", "up_proj")}, build, prefix)
        self.down = Linear(I, {f"{n}down_proj": H for n in experts}, build, prefix)
        if self.gate_up.int4_tiles and (2 * I % 16 or H % 16):
            raise ValueError(f"quantized experts need 2 * moe_intermediate_size ({2 * I}) and hidden_size ({H}) in "
                             f"whole 16-row tiles")

    @property
    def graph_safe(self) -> bool:
        """Its decode steps can be captured in a CUDA graph: 16-bit or int4 experts (not int8)."""
        return "int8" not in (self.gate_up.scheme, self.down.scheme)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = ops.moe_route(self.router(x), self.top_k, shared=self.shared_expert is None)
        y = ops.moe_experts(x, ids, weights, self.gate_up.held, self.down.held, self.inter)
        if self.shared_expert is not None:
            y = y + self.shared_expert(x) * torch.sigmoid(self.shared_gate(x))
        return y

    def checkpoint_slices(self):
        yield from self.router.checkpoint_slices()
        if self.shared_expert is not None:
            yield from self.shared_gate.checkpoint_slices()
            yield from self.shared_expert.checkpoint_slices()
        yield from self.gate_up.checkpoint_slices()
        yield from self.down.checkpoint_slices()

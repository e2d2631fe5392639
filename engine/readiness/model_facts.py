"""What a step of the engine's model reads, counted from the model itself built on the meta device (nothing
allocated): its weights in groups (the dense layers, the routed experts, the head, the MTP module, a block drafter),
their bytes, parameters and int4 share (engine/readiness/projection.py's steps are made of these)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from engine.model.config import ModelConfig


@dataclass(frozen=True)
class Group:
    """Some of a model's weights: the bytes a step reads, their parameters (multiply-adds per row), and how many of
    them are int4 (a GEMV unpacks them)."""
    bytes: float = 0.0
    params: float = 0.0
    int4: float = 0.0

    def __add__(self, o: Group) -> Group:
        return Group(self.bytes + o.bytes, self.params + o.params, self.int4 + o.int4)

    def __mul__(self, f: float) -> Group:
        return Group(self.bytes * f, self.params * f, self.int4 * f)


@dataclass(frozen=True)
class ModelFacts:
    shape: str
    weights: str
    cfg: ModelConfig
    dense: Group          # every layer's weights but the routed experts (the embedding table is gathered: not read)
    experts: Group        # routed experts (MoE), all of them
    head: Group
    mtp: Group


def tensor_group(tensors) -> Group:
    g = Group()
    for name, t in tensors:
        n = t.numel()
        if t.dtype == torch.int32 and name.endswith("qweight"):             # 8 int4 weights per word
            g += Group(n * 4, n * 8, n * 8)
        else:
            g += Group(n * t.element_size(), n if t.dim() == 2 and name.endswith("weight") else 0, 0)
    return g


@cache
def model_facts(shape: str, weights: str) -> ModelFacts:
    from engine.model.moe import SparseMoE
    from engine.readiness.forward import model_on_meta
    from engine.bench.random_model import text_config
    model = model_on_meta(shape, weights, layers=text_config(shape)["num_hidden_layers"])
    named = list(model.named_parameters()) + list(model.named_buffers())
    experts = Group()
    for m in model.modules():
        if isinstance(m, SparseMoE):           # (a shared expert stacked with them as expert E: every token reads it)
            share = m.num_experts / (m.num_experts + (m.shared_expert is None))
            experts += tensor_group([(n, t) for lin in (m.gate_up, m.down) for n, t in
                                     [*lin.named_parameters(), *lin.named_buffers()]]) * share
    body = tensor_group([(n, t) for n, t in named if n.startswith(("layers.", "norm."))])
    return ModelFacts(shape, weights, model.cfg, body + experts * -1, experts,
                      tensor_group([(n, t) for n, t in named if n.startswith("lm_head.")]),
                      tensor_group([(n, t) for n, t in named if n.startswith("mtp.")]))


@cache
def drafter_facts(shape: str, weights: str) -> tuple[Group, Group]:
    """(the weights a block's forward reads, those the context writes read: fc and each layer's k | v rows) of a
    block drafter of the published size for `shape` (engine/bench/random_model.DRAFTERS), as the engine holds it."""
    from engine.bench.random_model import drafter_config
    from engine.model.block_drafter import BlockDrafter
    from engine.model.drafter_config import parse_drafter_config
    from engine.model.linear import Build
    from engine.readiness.forward import DEFAULTS
    cfg = parse_drafter_config(drafter_config(shape))
    drafter = BlockDrafter(cfg, Build(torch.bfloat16, "meta", DEFAULTS.policy(weights)))
    named = [(n, t) for n, t in [*drafter.named_parameters(), *drafter.named_buffers()] if n not in ("freqs", "axis")]
    kv = 2 * cfg.num_kv_heads * cfg.head_dim
    kv_share = kv / (kv + cfg.num_heads * cfg.head_dim)
    fc = tensor_group([(n, t) for n, t in named if n.startswith("fc.")])
    kvq = tensor_group([(n, t) for n, t in named if ".kvq." in n])
    return tensor_group(named) + fc * -1, fc + kvq * kv_share


def moe_layers(m: ModelFacts) -> int:
    return m.cfg.num_layers if m.cfg.num_experts else 0


def expert_share(cfg, tokens: int) -> float:
    """The share of the routed experts a step of `tokens` tokens reads: E (1 - (1 - k/E)^tokens) of E (uniform)."""
    if not cfg.num_experts:
        return 0.0
    return 1 - (1 - cfg.num_experts_per_tok / cfg.num_experts) ** tokens

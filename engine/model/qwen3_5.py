"""The Qwen3.5-family text decoder: embeddings, hybrid GDN / gated-attention layers, final norm,
LM head, and (when the checkpoint has it) the MTP draft module."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.cache.pages import CacheTensors
from engine.model.batch import ForwardBatch
from engine.model.block_drafter import BlockDrafter, step_ring_slots
from engine.model.drafter_config import check_drafter
from engine.model.layers import DecoderLayer, RMSNorm
from engine.model.linear import Build, Embedding, Linear
from engine.model.mtp import MTP
from qwendesk_kernels.rope import inv_freq, mrope_axis


class Rotary(nn.Module):
    """The rotary frequencies and, per frequency, which mRoPE position axis drives it; the attention
    kernel turns a row's [3] positions into angles itself."""

    def __init__(self, cfg: ModelConfig, device):
        super().__init__()
        self.register_buffer("freqs", inv_freq(cfg.rotary_dim, cfg.rope_theta, device), persistent=False)
        self.register_buffer("axis", mrope_axis(cfg.rotary_dim, cfg.mrope_section, device), persistent=False)

    def forward(self):
        return self.freqs, self.axis


class Qwen3_5Model(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device, with_mtp: bool = False, policy=None):
        """policy: engine.weights.policy.QuantPolicy deciding which weights are int4 / int8 (None: all dtype)."""
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        build = Build(dtype, device, policy)
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size, build, "embed_tokens")
        self.layers = nn.ModuleList(DecoderLayer(cfg, kind, build, f"layers.{i}.")
                                    for i, kind in enumerate(cfg.layer_types))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build)
        self.lm_head = self.embed if cfg.tie_word_embeddings else \
            Linear(cfg.hidden_size, {"lm_head": cfg.vocab_size}, build, prefix="")
        self.rotary = Rotary(cfg, device)
        self.mtp = MTP(cfg, build) if with_mtp and cfg.num_mtp_layers else None
        self.drafter: BlockDrafter | None = None    # every forward writes its context (attach_drafter)
        # where each layer's pools are: index into CacheTensors.k/v (attention) or .conv/.ssm (GDN)
        self._pool_index = []
        n_attn = n_gdn = 0
        for kind in cfg.layer_types:
            if kind == "full_attention":
                self._pool_index.append(n_attn)
                n_attn += 1
            else:
                self._pool_index.append(n_gdn)
                n_gdn += 1
        self.num_attn_layers = n_attn

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed.lookup(input_ids)

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, pools: CacheTensors) -> torch.Tensor:
        """Packed input ids [T] -> final hidden states [T, hidden] (after the final norm). Rows of image tokens take
        the batch's image embeddings instead of the token table's."""
        x = self.embed_tokens(input_ids)
        if batch.image_rows is not None and batch.image_embeds is not None:
            x = x.index_copy(0, batch.image_rows, batch.image_embeds.to(x.dtype))
        rope = self.rotary()
        residual = None
        drafter = self.drafter
        taps = drafter.taps if drafter is not None else {}
        features = x.new_empty(x.shape[0], len(taps) * x.shape[1]) if taps else None
        for i, (layer, idx) in enumerate(zip(self.layers, self._pool_index)):
            if layer.kind == "full_attention":
                x, residual = layer(x, residual, batch, rope, pools.attention_layer(idx))
            else:
                verify = batch.verify.layer(idx) if batch.verify is not None else None
                x, residual = layer(x, residual, batch, rope, pools.gdn_layer(idx), verify)
            if features is not None and i in taps:  # the residual stream after layer i (HF's hidden_states[i + 1])
                H = x.shape[1]
                torch.add(x, residual, out=features[:, taps[i] * H:(taps[i] + 1) * H])
        if drafter is not None and features is not None:
            rings = step_ring_slots(batch, pools.ring_tokens) if pools.ring_tokens else None
            drafter.write_context(features, batch.positions[0], batch.slot_mapping, rings, pools)
        h, _ = self.norm.add_forward(x, residual)
        return h

    def attach_drafter(self, drafter: BlockDrafter) -> None:
        """From now on every forward (prefill, decode, verify) also writes the drafter's context K / V of its rows
        (engine/model/block_drafter.py), inside the same CUDA graphs."""
        check_drafter(drafter.cfg, self.cfg)
        self.drafter = drafter

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def mtp_forward(self, next_ids, hidden, batch: ForwardBatch, pools: CacheTensors) -> torch.Tensor:
        """MTP draft step: token t+1 ids with the main model's hidden state at t -> MTP hidden [T, H].
        Its attention layer's KV pages come after the main model's in the pools."""
        if self.mtp is None:
            raise RuntimeError("the model was built without its MTP layer")
        rope = self.rotary()
        return self.mtp(self.embed_tokens(next_ids), hidden, batch, rope, pools.attention_layer(self.num_attn_layers))

    def checkpoint_slices(self):
        """(name without the model prefix, target, first row, expected checkpoint shape); the target is a
        parameter, or a Linear filled with Linear.load_rows."""
        yield from self.embed.checkpoint_slices()
        for layer in self.layers:
            yield from layer.checkpoint_slices()
        yield "norm.weight", self.norm.weight, 0, (self.cfg.hidden_size,)
        if not self.cfg.tie_word_embeddings:
            yield from self.lm_head.checkpoint_slices()
        if self.mtp is not None:
            yield from self.mtp.checkpoint_slices()

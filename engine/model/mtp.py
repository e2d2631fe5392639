"""Multi-token prediction module: predicts token t+2 from token t+1 and the decoder's hidden state
at t. fc(concat(norm(embed(t+1)), norm(h_t))) -> one full-attention decoder layer -> norm; the
LM head is the main model's."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.model.layers import DecoderLayer, RMSNorm
from engine.model.linear import Build, Linear


class MTP(nn.Module):
    def __init__(self, cfg: ModelConfig, build: Build, prefix: str = "mtp."):
        super().__init__()
        h = cfg.hidden_size
        self.prefix = prefix
        self.pre_fc_norm_embedding = RMSNorm(h, cfg.rms_norm_eps, build)
        self.pre_fc_norm_hidden = RMSNorm(h, cfg.rms_norm_eps, build)
        self.fc = Linear(2 * h, {"fc": h}, build, prefix)
        self.layer = DecoderLayer(cfg, "full_attention", build, prefix + "layers.0.")
        self.norm = RMSNorm(h, cfg.rms_norm_eps, build)

    def forward(self, embeds, hidden, batch, rope, pools):
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x, residual = self.layer(self.fc(x), None, batch, rope, pools)
        h, _ = self.norm.add_forward(x, residual)
        return h

    def checkpoint_slices(self):
        h = self.fc.shape[0]
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            yield f"{self.prefix}{name}.weight", getattr(self, name).weight, 0, (h,)
        yield from self.fc.checkpoint_slices()
        yield from self.layer.checkpoint_slices()

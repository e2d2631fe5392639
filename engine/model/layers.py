"""The decoder's building blocks: norms, SwiGLU MLP, gated full attention, Gated DeltaNet.

Projections that read the same input are fused into one weight at load time (attention
q|gate|k|v, GDN qkv|z|b|a, MLP gate|up) so that decode runs one GEMV per group.
`checkpoint_slices` lists which checkpoint tensor fills which rows of which parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.model.batch import ForwardBatch
from kernels import ops


def _param(*shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T, with W [out, in] built from one or more checkpoint tensors stacked by rows."""

    def __init__(self, in_features: int, parts: dict[str, int], dtype, device):
        super().__init__()
        self.parts = parts  # checkpoint name suffix -> rows, in stacking order
        self.weight = _param(sum(parts.values()), in_features, dtype=dtype, device=device)

    def forward(self, x):
        return ops.linear(x, self.weight)

    def checkpoint_slices(self, prefix: str):
        row = 0
        for name, rows in self.parts.items():
            yield f"{prefix}{name}.weight", self.weight, row, (rows, self.weight.shape[1])
            row += rows


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: x / rms(x) * (1 + w)."""

    def __init__(self, dim: int, eps: float, dtype, device):
        super().__init__()
        self.eps = eps
        self.weight = _param(dim, dtype=dtype, device=device)

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x, residual):
        """(norm(x + residual), x + residual); the first layer passes residual=None."""
        if residual is None:
            return self.forward(x), x
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype, device):
        super().__init__()
        n = cfg.intermediate_size
        self.gate_up = Linear(cfg.hidden_size, {"gate_proj": n, "up_proj": n}, dtype, device)
        self.down = Linear(n, {"down_proj": cfg.hidden_size}, dtype, device)

    def forward(self, x):
        return self.down(ops.silu_mul(self.gate_up(x)))

    def checkpoint_slices(self, prefix):
        yield from self.gate_up.checkpoint_slices(prefix)
        yield from self.down.checkpoint_slices(prefix)


class GatedAttention(nn.Module):
    """GQA with q/k RMSNorm, partial mRoPE and a per-head sigmoid output gate (from q_proj)."""

    def __init__(self, cfg: ModelConfig, dtype, device):
        super().__init__()
        self.cfg = cfg
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, {"q_proj": 2 * hq * d, "k_proj": hkv * d, "v_proj": hkv * d}, dtype, device)
        self.o_proj = Linear(hq * d, {"o_proj": cfg.hidden_size}, dtype, device)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, dtype, device)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, dtype, device)
        self.scale = d ** -0.5

    def forward(self, x, batch: ForwardBatch, rope, pools):
        k_cache, v_cache, k_scale, v_scale = pools
        cfg = self.cfg
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        T = x.shape[0]
        qg, k, v = self.qkv(x).split([2 * hq * d, hkv * d, hkv * d], dim=-1)
        q, gate = qg.view(T, hq, 2 * d).chunk(2, dim=-1)     # q_proj rows interleave q and gate per head
        q = ops.apply_rope(self.q_norm(q), *rope)
        k = ops.apply_rope(self.k_norm(k.view(T, hkv, d)), *rope)
        ops.store_kv(k, v.view(T, hkv, d), k_cache, v_cache, batch.slot_mapping, k_scale=k_scale, v_scale=v_scale)
        o = ops.paged_attention(q.contiguous(), k_cache, v_cache, batch.block_tables, batch.cu_seqlens,
                                batch.seq_lens, self.scale, k_scale=k_scale, v_scale=v_scale,
                                decode_q_len=batch.decode_len or None, max_seq_len=batch.max_seq_len)
        o = o.reshape(T, hq * d) * torch.sigmoid(gate.reshape(T, hq * d))
        return self.o_proj(o)

    def checkpoint_slices(self, prefix):
        yield from self.qkv.checkpoint_slices(prefix)
        yield from self.o_proj.checkpoint_slices(prefix)
        for name in ("q_norm", "k_norm"):
            w = getattr(self, name).weight
            yield f"{prefix}{name}.weight", w, 0, tuple(w.shape)


class GatedDeltaNet(nn.Module):
    """Linear attention: causal conv + SiLU over q|k|v, gated delta rule, gated RMSNorm, out proj."""

    def __init__(self, cfg: ModelConfig, dtype, device):
        super().__init__()
        self.cfg = cfg
        hv = cfg.linear_num_v_heads
        self.in_proj = Linear(cfg.hidden_size, {"in_proj_qkv": cfg.conv_dim, "in_proj_z": cfg.linear_value_dim,
                                                "in_proj_b": hv, "in_proj_a": hv}, dtype, device)
        self.conv_weight = _param(cfg.conv_dim, cfg.conv_kernel, dtype=dtype, device=device)
        self.A_log = _param(hv, dtype=torch.float32, device=device)
        self.dt_bias = _param(hv, dtype=torch.float32, device=device)
        self.norm_weight = _param(cfg.linear_v_head_dim, dtype=dtype, device=device)
        self.out_proj = Linear(cfg.linear_value_dim, {"out_proj": cfg.hidden_size}, dtype, device)

    def forward(self, x, batch: ForwardBatch, pools):
        conv_state, ssm_state = pools
        cfg = self.cfg
        T = x.shape[0]
        hk, hv, dk, dv = cfg.linear_num_k_heads, cfg.linear_num_v_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim
        qkv, z, b, a = self.in_proj(x).split([cfg.conv_dim, cfg.linear_value_dim, hv, hv], dim=-1)
        if batch.decode_len:
            # one fused kernel: conv update, gating, L2 norms and the delta-rule steps
            o = ops.gdn_decode(qkv, a, b, self.conv_weight, conv_state, self.A_log, self.dt_bias, ssm_state,
                               batch.state_slots, batch.has_state)
        else:
            qkv = ops.causal_conv1d(qkv, self.conv_weight, conv_state, batch.state_slots, batch.cu_seqlens,
                                    batch.has_state)
            q, k, v = qkv.split([cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim], dim=-1)
            g, beta = ops.gdn_gating(a, b, self.A_log, self.dt_bias)
            o = ops.gated_delta_rule(q.view(T, hk, dk), k.view(T, hk, dk), v.reshape(T, hv, dv), g, beta,
                                     ssm_state, batch.state_slots, batch.cu_seqlens, batch.has_state)
        o = ops.gated_rms_norm(o, z.view(T, hv, dv), self.norm_weight, cfg.rms_norm_eps)
        return self.out_proj(o.reshape(T, hv * dv))

    def checkpoint_slices(self, prefix):
        yield from self.in_proj.checkpoint_slices(prefix)
        yield from self.out_proj.checkpoint_slices(prefix)
        cfg = self.cfg
        yield f"{prefix}conv1d.weight", self.conv_weight, 0, (cfg.conv_dim, 1, cfg.conv_kernel)
        yield f"{prefix}A_log", self.A_log, 0, (cfg.linear_num_v_heads,)
        yield f"{prefix}dt_bias", self.dt_bias, 0, (cfg.linear_num_v_heads,)
        yield f"{prefix}norm.weight", self.norm_weight, 0, (cfg.linear_v_head_dim,)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, kind: str, dtype, device):
        super().__init__()
        self.kind = kind
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        if kind == "full_attention":
            self.attn = GatedAttention(cfg, dtype, device)
        else:
            self.gdn = GatedDeltaNet(cfg, dtype, device)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = MLP(cfg, dtype, device)

    def forward(self, x, residual, batch, rope, pools):
        """Pre-norm block with the residual carried separately (fused add + norm).
        pools: this layer's cache (KV pools for attention, conv/recurrent state for GDN)."""
        h, residual = self.input_norm.add_forward(x, residual)
        if self.kind == "full_attention":
            h = self.attn(h, batch, rope, pools)
        else:
            h = self.gdn(h, batch, pools)
        h, residual = self.post_norm.add_forward(h, residual)
        return self.mlp(h), residual

    def checkpoint_slices(self, prefix):
        yield f"{prefix}input_layernorm.weight", self.input_norm.weight, 0, tuple(self.input_norm.weight.shape)
        yield f"{prefix}post_attention_layernorm.weight", self.post_norm.weight, 0, tuple(self.post_norm.weight.shape)
        if self.kind == "full_attention":
            yield from self.attn.checkpoint_slices(prefix + "self_attn.")
        else:
            yield from self.gdn.checkpoint_slices(prefix + "linear_attn.")
        yield from self.mlp.checkpoint_slices(prefix + "mlp.")

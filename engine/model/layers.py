"""The decoder's building blocks: norms, SwiGLU MLP, gated full attention, Gated DeltaNet (an MoE model's layers
take engine/model/moe.SparseMoE for the MLP).

Projections that read the same input are fused into one weight at load time (attention
q|gate|k|v, GDN qkv|z|b|a, MLP gate|up) so that decode runs one GEMV per group; the GDN's tiny
b|a rows stay apart when the policy keeps them 16-bit while qkv|z is quantized.
`checkpoint_slices` lists which checkpoint tensor fills which rows of which weight.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.model.drafter_config import DrafterConfig
from engine.model.batch import ForwardBatch
from engine.model.linear import Build, Linear, param
from qwendesk_kernels.quant_format import Int4Weight
from engine.model.moe import SparseMoE
from qwendesk_kernels import ops


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: x / rms(x) * (1 + w)."""

    def __init__(self, dim: int, eps: float, build: Build):
        super().__init__()
        self.eps = eps
        self.weight = param(build.empty(dim))

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x, residual):
        """(norm(x + residual), x + residual); the first layer passes residual=None."""
        if residual is None:
            return self.forward(x), x
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig | DrafterConfig, build: Build, prefix: str, intermediate: int | None = None):
        """intermediate: the SwiGLU width (default: the config's; an MoE layer's shared expert has its own)."""
        super().__init__()
        n = intermediate or cfg.intermediate_size
        self.gate_up = Linear(cfg.hidden_size, {"gate_proj": n, "up_proj": n}, build, prefix)
        self.down = Linear(n, {"down_proj": cfg.hidden_size}, build, prefix)

    def forward(self, x):
        if self.gate_up.scheme == "int4":          # at decode: SwiGLU in the GEMV's epilogue, one launch fewer
            w = self.gate_up.quantized()
            assert isinstance(w, Int4Weight)
            return self.down(ops.int4_swiglu(x, w))
        return self.down(ops.silu_mul(self.gate_up(x)))

    def checkpoint_slices(self):
        yield from self.gate_up.checkpoint_slices()
        yield from self.down.checkpoint_slices()


class GatedAttention(nn.Module):
    """GQA with q/k RMSNorm, partial mRoPE and a per-head sigmoid output gate (from q_proj)."""

    def __init__(self, cfg: ModelConfig, build: Build, prefix: str):
        super().__init__()
        self.cfg = cfg
        self.prefix = prefix
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, {"q_proj": 2 * hq * d, "k_proj": hkv * d, "v_proj": hkv * d}, build, prefix)
        self.o_proj = Linear(hq * d, {"o_proj": cfg.hidden_size}, build, prefix)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, build)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, build)
        self.scale = d ** -0.5

    def forward(self, x, batch: ForwardBatch, rope, pools):
        k_cache, v_cache, k_scale, v_scale = pools
        cfg = self.cfg
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        T = x.shape[0]
        qg, k, v = self.qkv(x).split([2 * hq * d, hkv * d, hkv * d], dim=-1)
        q, gate = qg.view(T, hq, 2 * d).chunk(2, dim=-1)     # q_proj rows interleave q and gate per head
        k = k.view(T, hkv, d)
        ops.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, cfg.rms_norm_eps, batch.positions, *rope)
        ops.store_kv(k, v.view(T, hkv, d), k_cache, v_cache, batch.slot_mapping, k_scale=k_scale, v_scale=v_scale)
        o = ops.paged_attention(q, k_cache, v_cache, batch.block_tables, batch.cu_seqlens, batch.seq_lens,
                                self.scale, k_scale=k_scale, v_scale=v_scale, decode_q_len=batch.decode_len or None,
                                max_seq_len=batch.max_seq_len, gate=gate)      # o * sigmoid(gate)
        return self.o_proj(o.view(T, hq * d))

    def checkpoint_slices(self):
        yield from self.qkv.checkpoint_slices()
        yield from self.o_proj.checkpoint_slices()
        for name in ("q_norm", "k_norm"):
            w = getattr(self, name).weight
            yield f"{self.prefix}{name}.weight", w, 0, tuple(w.shape)


class GatedDeltaNet(nn.Module):
    """Linear attention: causal conv + SiLU over q|k|v, gated delta rule, gated RMSNorm, out proj."""

    def __init__(self, cfg: ModelConfig, build: Build, prefix: str):
        super().__init__()
        self.cfg = cfg
        self.prefix = prefix
        hv, h = cfg.linear_num_v_heads, cfg.hidden_size
        qkvz = {"in_proj_qkv": cfg.conv_dim, "in_proj_z": cfg.linear_value_dim}
        ba = {"in_proj_b": hv, "in_proj_a": hv}
        # one fused in_proj when b / a take in_proj's scheme; else (the policy keeps b / a 16-bit) a Linear of their own
        same_scheme = build.scheme(f"{prefix}in_proj_qkv.weight", (cfg.conv_dim, h)) == \
            build.scheme(f"{prefix}in_proj_b.weight", (hv, h))
        if same_scheme:
            self.in_proj, self.in_proj_ba = Linear(h, {**qkvz, **ba}, build, prefix), None
        else:
            self.in_proj, self.in_proj_ba = Linear(h, qkvz, build, prefix), Linear(h, ba, build, prefix)
        self.conv_weight = param(build.empty(cfg.conv_dim, cfg.conv_kernel))
        self.A_log = param(build.empty(hv, dtype=torch.float32))
        self.dt_bias = param(build.empty(hv, dtype=torch.float32))
        self.norm_weight = param(build.empty(cfg.linear_v_head_dim))
        self.out_proj = Linear(cfg.linear_value_dim, {"out_proj": h}, build, prefix)

    def forward(self, x, batch: ForwardBatch, pools, verify=None):
        """verify: this layer's VerifyRows in a speculative verify step (the states stay as they are)."""
        conv_state, ssm_state = pools
        cfg = self.cfg
        T = x.shape[0]
        hk, hv, dk, dv = cfg.linear_num_k_heads, cfg.linear_num_v_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim
        # a 16-bit b|a apart from a quantized in_proj: at decode, the GDN step projects it itself
        ba_proj = None
        if self.in_proj_ba is None:
            qkv, z, b, a = self.in_proj(x).split([cfg.conv_dim, cfg.linear_value_dim, hv, hv], dim=-1)
        else:
            qkv, z = self.in_proj(x).split([cfg.conv_dim, cfg.linear_value_dim], dim=-1)
            if batch.decode_len and self.in_proj_ba.scheme == "float":
                b = a = None
                ba_proj = (x, self.in_proj_ba.weight)
            else:
                b, a = self.in_proj_ba(x).split([hv, hv], dim=-1)
        z = z.view(T, hv, dv)
        if batch.decode_len:
            # one fused kernel: conv update, gating, L2 norms, the delta-rule steps and the gated norm
            o = ops.gdn_decode(qkv, a, b, self.conv_weight, conv_state, self.A_log, self.dt_bias, ssm_state,
                               batch.state_slots, batch.has_state, verify=verify, ba_proj=ba_proj,
                               norm=(z, self.norm_weight, cfg.rms_norm_eps))
            return self.out_proj(o.reshape(T, hv * dv))
        snap = batch.snapshot
        if snap is not None:     # a snapshot's conv window: the conv_kernel - 1 input rows before it
            conv_state[snap.conv_slots] = qkv[snap.conv_rows]
        qkv = ops.causal_conv1d(qkv, self.conv_weight, conv_state, batch.state_slots, batch.cu_seqlens,
                                batch.has_state)
        q, k, v = qkv.split([cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim], dim=-1)
        g, beta = ops.gdn_gating(a, b, self.A_log, self.dt_bias)
        o = ops.gated_delta_rule(q.view(T, hk, dk), k.view(T, hk, dk), v.reshape(T, hv, dv), g, beta,
                                 ssm_state, batch.state_slots, batch.cu_seqlens, batch.has_state,
                                 *((snap.tokens, snap.slots) if snap is not None else ()))
        o = ops.gated_rms_norm(o, z, self.norm_weight, cfg.rms_norm_eps)
        return self.out_proj(o.reshape(T, hv * dv))

    def checkpoint_slices(self):
        yield from self.in_proj.checkpoint_slices()
        if self.in_proj_ba is not None:
            yield from self.in_proj_ba.checkpoint_slices()
        yield from self.out_proj.checkpoint_slices()
        cfg, prefix = self.cfg, self.prefix
        yield f"{prefix}conv1d.weight", self.conv_weight, 0, (cfg.conv_dim, 1, cfg.conv_kernel)
        yield f"{prefix}A_log", self.A_log, 0, (cfg.linear_num_v_heads,)
        yield f"{prefix}dt_bias", self.dt_bias, 0, (cfg.linear_num_v_heads,)
        yield f"{prefix}norm.weight", self.norm_weight, 0, (cfg.linear_v_head_dim,)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, kind: str, build: Build, prefix: str):
        super().__init__()
        self.kind = kind
        self.prefix = prefix
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build)
        if kind == "full_attention":
            self.attn = GatedAttention(cfg, build, prefix + "self_attn.")
        else:
            self.gdn = GatedDeltaNet(cfg, build, prefix + "linear_attn.")
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, build)
        if cfg.is_moe:
            shared = None if cfg.shared_expert_stacked else MLP(cfg, build, prefix + "mlp.shared_expert.",
                                                                cfg.shared_expert_intermediate_size)
            self.mlp = SparseMoE(cfg, build, prefix + "mlp.", shared)
        else:
            self.mlp = MLP(cfg, build, prefix + "mlp.")

    def forward(self, x, residual, batch, rope, pools, verify=None):
        """Pre-norm block with the residual carried separately (fused add + norm).
        pools: this layer's part of the CacheTensors (KV pages for attention, conv/recurrent state for GDN); verify:
        a GDN layer's VerifyRows in a speculative verify step."""
        h, residual = self.input_norm.add_forward(x, residual)
        if self.kind == "full_attention":
            h = self.attn(h, batch, rope, pools)
        else:
            h = self.gdn(h, batch, pools, verify)
        h, residual = self.post_norm.add_forward(h, residual)
        return self.mlp(h), residual

    def checkpoint_slices(self):
        prefix = self.prefix
        yield f"{prefix}input_layernorm.weight", self.input_norm.weight, 0, tuple(self.input_norm.weight.shape)
        yield f"{prefix}post_attention_layernorm.weight", self.post_norm.weight, 0, tuple(self.post_norm.weight.shape)
        yield from (self.attn if self.kind == "full_attention" else self.gdn).checkpoint_slices()
        yield from self.mlp.checkpoint_slices()

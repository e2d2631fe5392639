"""Gated DeltaNet benchmarks at the 27B shapes (`python -m qwendesk_kernels.bench gdn`).

Decode is counted by the recurrent state it must read and write (48 v heads x 128 x 128 fp32 = 3 MiB per
sequence and layer); the `x48_graph` cases replay one CUDA graph of 48 layers (48 separate state pools), so
their time is per token, not per layer. `split` cases run conv update + a recurrent kernel (two launches)
instead of the fused kernel, to show what fusing the conv saves. `verify` reads the state once and writes only
its rows' replay inputs; `replay` advances 48 layers' states by the accepted rows in one launch.
"""

from __future__ import annotations

from functools import partial

import torch

from qwendesk_kernels.bench import Case, graph_replay
from qwendesk_kernels.conv1d import causal_conv1d, causal_conv1d_ref, causal_conv1d_update
from qwendesk_kernels.gdn import (RECURRENT_MAX_TOKENS, VerifyRows, _fla_chunk, gated_delta_rule, gated_delta_rule_fla,
                         gated_delta_rule_ref, gdn_decode, gdn_decode_ref, gdn_gating_ref, gdn_replay,
                         recurrent_gated_delta_rule_triton)

HK, HV, K, V, W = 16, 48, 128, 128, 4
CONV_DIM = 2 * HK * K + HV * V                   # q | k | v channels: 10240
PROJ = CONV_DIM + HV * V + 2 * HV                # in_proj rows: qkv | z | b | a
STATE_BYTES = HV * K * V * 4                     # one sequence, one layer
LAYERS = 48
DEV = "cuda"


def _decode_inputs(B, L):
    """gdn_decode keyword arguments: raw projection rows as strided slices, slots out of order."""
    proj = torch.randn(B * L, PROJ, dtype=torch.bfloat16, device=DEV)
    num_slots = B + 2
    return dict(qkv=proj[:, :CONV_DIM], a=proj[:, -HV:], b=proj[:, -2 * HV:-HV],
                conv_weight=0.5 * torch.randn(CONV_DIM, W, dtype=torch.bfloat16, device=DEV),
                conv_state=torch.randn(num_slots, W - 1, CONV_DIM, dtype=torch.bfloat16, device=DEV),
                A_log=torch.empty(HV, device=DEV).uniform_(0.05, 4).log(), dt_bias=torch.zeros(HV, device=DEV),
                ssm_state=0.1 * torch.randn(num_slots, HV, K, V, device=DEV),
                slots=torch.randperm(num_slots, device=DEV)[:B], has_state=torch.ones(B, dtype=torch.bool, device=DEV))


def _split_decode(x, L):
    """The unfused alternative: conv update kernel, then the recurrent kernel with the gating inside."""
    B = x["slots"].shape[0]
    cu = torch.arange(B + 1, dtype=torch.int32, device=DEV) * L

    def run():
        y = causal_conv1d_update(x["qkv"], x["conv_weight"], x["conv_state"], x["slots"], x["has_state"])
        q, k, v = y.split([HK * K, HK * K, HV * V], dim=-1)
        return recurrent_gated_delta_rule_triton(q.view(-1, HK, K), k.view(-1, HK, K), v.view(-1, HV, V), x["a"],
                                                 x["b"], x["ssm_state"], x["slots"], cu, x["has_state"],
                                                 x["A_log"], x["dt_bias"])
    return run


def _fla_recurrent_baseline(B, L):
    """fla's fused_recurrent_gated_delta_rule on already convolved q/k/v (the FACTS.md decode number), or None."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    q, k = (torch.randn(B, L, HK, K, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    v = torch.randn(B, L, HV, V, dtype=torch.bfloat16, device=DEV)
    g, beta = gdn_gating_ref(torch.randn(B, L, HV, device=DEV), torch.randn(B, L, HV, device=DEV),
                             torch.zeros(HV, device=DEV), torch.zeros(HV, device=DEV))
    init = 0.1 * torch.randn(B, HV, K, V, device=DEV)
    return lambda: fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True)


def _replay(B, L):
    """gdn_replay of L verify rows per sequence over 48 layers' state pools (3 rows accepted each)."""
    conv = torch.randn(LAYERS, B + 2, W - 1, CONV_DIM, dtype=torch.bfloat16, device=DEV)
    ssm = 0.1 * torch.randn(LAYERS, B + 2, HV, K, V, device=DEV)
    rows = VerifyRows.allocate(LAYERS, B, L, CONV_DIM, HV, torch.bfloat16, DEV)
    rows.qkv.normal_()
    rows.gb[..., 0, :].uniform_(-1, 0)
    rows.gb[..., 1, :].uniform_(0, 1)
    slots = torch.arange(B, device=DEV)
    accepted = torch.full((B,), 3, dtype=torch.int32, device=DEV)
    return graph_replay(lambda: gdn_replay(conv, ssm, slots, accepted, rows))


def _decode_cases():
    cases = []
    target = ">= 50% of copy bw (state read + write)"
    for B in (1, 2, 4, 8):
        x = _decode_inputs(B, 1)
        fla = _fla_recurrent_baseline(B, 1)
        cases.append(Case("gdn", f"decode_b{B}", partial(gdn_decode, **x), bytes=2 * B * STATE_BYTES,
                          baseline=fla or partial(gdn_decode_ref, **x), target=target + (
                              ", vs fla fused_recurrent" if fla else ", vs composed torch refs"), target_frac=0.5))
    for B in (1, 8):
        cases.append(Case("gdn", f"decode_b{B}_split_conv", _split_decode(_decode_inputs(B, 1), 1),
                          bytes=2 * B * STATE_BYTES, target=target + " (unfused variant, for comparison)",
                          target_frac=0.5))
    for B in (1, 8):
        layers = [_decode_inputs(B, 1) for _ in range(LAYERS)]
        replay = graph_replay(lambda layers=layers: [gdn_decode(**x) for x in layers])
        cases.append(Case("gdn", f"decode_b{B}_x48_graph (us per token)", replay,
                          bytes=LAYERS * 2 * B * STATE_BYTES, target=target + ", 48 layers in one graph",
                          target_frac=0.5))
    L = 4
    for B in (1, 8):
        x = _decode_inputs(B, L)
        rows = VerifyRows.allocate(1, B, L, CONV_DIM, HV, torch.bfloat16, DEV)

        def verify(x=x, rows=rows):
            return gdn_decode(**x, verify=rows.layer(0))

        cases.append(Case("gdn", f"verify_b{B}_L{L}", verify, bytes=B * STATE_BYTES,
                          target=">= 50% of copy bw (state read)", target_frac=0.5))
        cases.append(Case("gdn", f"replay_b{B}_L{L}_x48 (us per round)", _replay(B, L),
                          bytes=LAYERS * 2 * B * STATE_BYTES, target=target + ", 48 layers in one launch",
                          target_frac=0.5))
    return cases


def _conv_prefill_case(T=8192):
    proj = torch.randn(T, PROJ, dtype=torch.bfloat16, device=DEV)
    weight = 0.5 * torch.randn(CONV_DIM, W, dtype=torch.bfloat16, device=DEV)
    state = torch.randn(2, W - 1, CONV_DIM, dtype=torch.bfloat16, device=DEV)
    ref_state = state.clone()
    args = (torch.tensor([1], device=DEV), torch.tensor([0, T], dtype=torch.int32, device=DEV),
            torch.ones(1, dtype=torch.bool, device=DEV))
    x = proj[:, :CONV_DIM]
    return Case("gdn", f"conv_prefill_{T // 1024}k", lambda: causal_conv1d(x, weight, state, *args),
                bytes=2 * T * CONV_DIM * 2, baseline=lambda: causal_conv1d_ref(x, weight, ref_state, *args),
                target=">= 70% of copy bw", target_frac=0.7)


def _prefill_inputs(T: int) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                                    torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """((q, k, v, g, beta), state, (slots, cu_seqlens, has_state)) of one sequence's prefill of T tokens."""
    qkv = torch.randn(T, CONV_DIM, dtype=torch.bfloat16, device=DEV)
    q, k, v = qkv.split([HK * K, HK * K, HV * V], dim=-1)
    g, beta = gdn_gating_ref(torch.randn(T, HV, device=DEV), torch.randn(T, HV, device=DEV),
                             torch.empty(HV, device=DEV).uniform_(0.05, 4).log(), torch.zeros(HV, device=DEV))
    meta = (torch.tensor([1], device=DEV), torch.tensor([0, T], dtype=torch.int32, device=DEV),
            torch.ones(1, dtype=torch.bool, device=DEV))
    state = 0.1 * torch.randn(2, HV, K, V, device=DEV)
    return (q.view(T, HK, K), k.view(T, HK, K), v.view(T, HV, V), g, beta), state, meta


def _prefill_case(T, facts_ms):
    """gated_delta_rule as the model calls it at T tokens (fla above RECURRENT_MAX_TOKENS, when importable)."""
    x, state, meta = _prefill_inputs(T)
    ref_state = state.clone()
    path = "fla" if _fla_chunk() is not None and T > RECURRENT_MAX_TOKENS else "triton_recurrent"
    return Case("gdn", f"prefill_{T}_{path}", lambda: gated_delta_rule(*x, state, *meta),
                bytes=T * (2 * HK * K + 2 * HV * V) * 2 + 2 * STATE_BYTES,
                baseline=lambda: gated_delta_rule_ref(*x, ref_state, *meta),
                target=f"<= {facts_ms} ms (FACTS.md: fla alone, one layer)", target_us=facts_ms * 1e3)


def _short_prefill_cases():
    """Short chunks, timed back to back as the engine issues them (host time included): the recurrent kernel vs
    fla's chunked one, which sets RECURRENT_MAX_TOKENS."""
    cases = []
    for T in (64, 256, 512, 1024, 2048):
        x, state, meta = _prefill_inputs(T)
        recurrent = partial(recurrent_gated_delta_rule_triton, *x, state, *meta)
        fla = partial(gated_delta_rule_fla, *x, state, *meta)

        cases.append(Case("gdn", f"prefill_{T}_recurrent (vs ref = vs fla chunked)", recurrent,
                          bytes=T * (2 * HK * K + 2 * HV * V) * 2 + 2 * STATE_BYTES,
                          baseline=fla if _fla_chunk() else None))
    return cases


def cases() -> list[Case]:
    return [*_decode_cases(), _conv_prefill_case(), *_short_prefill_cases(), _prefill_case(8192, 0.70)]

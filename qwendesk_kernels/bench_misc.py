"""Norms, rotary and SwiGLU at the 27B shapes: decode (T = 1, 8) and prefill (T = 8192).

Bytes: inputs read + outputs written (weights included). Baseline: the torch reference on the same
inputs (for q/k norm + rotary, the model's current composition: cos/sin table, two norms, two ropes).
Target at prefill: >= 70% of copy bandwidth; decode cases are latency, no target.
"""

from __future__ import annotations

from typing import Any

import torch

from qwendesk_kernels.activation import silu_mul, silu_mul_ref
from qwendesk_kernels.bench import Case
from qwendesk_kernels.norm import (add_rms_norm, add_rms_norm_ref, gated_rms_norm, gated_rms_norm_ref, rms_norm,
                                   rms_norm_ref)
from qwendesk_kernels.rope import apply_rope_ref, inv_freq, mrope_axis, qk_norm_rope, rope_cos_sin

HIDDEN, HQ, HK, HD, ROTARY, SECTION, EPS = 5120, 24, 4, 256, 64, (11, 11, 10), 1e-6
GDN_HV, GDN_DV, FFN = 48, 128, 17408
TOKENS = (1, 8, 8192)


def _case(name, T, fn, baseline, nbytes):
    target: dict[str, Any] = dict(target=">= 70% of copy bw", target_frac=0.7) if T >= 1024 else {}
    return Case("misc", f"{name} T={T}", fn, bytes=nbytes, baseline=baseline, **target)


def cases() -> list[Case]:
    dt, dev = torch.bfloat16, "cuda"
    out = []
    for T in TOKENS:
        x = torch.randn(T, HIDDEN, dtype=dt, device=dev)
        res = torch.randn(T, HIDDEN, dtype=dt, device=dev)
        w = torch.randn(HIDDEN, dtype=dt, device=dev) * 0.1
        act = T * HIDDEN * 2
        out.append(_case("rms_norm 5120", T, lambda x=x, w=w: rms_norm(x, w, EPS),
                         lambda x=x, w=w: rms_norm_ref(x, w, EPS), 2 * act + HIDDEN * 2))
        out.append(_case("add_rms_norm 5120", T, lambda x=x, r=res, w=w: add_rms_norm(x, r, w, EPS),
                         lambda x=x, r=res, w=w: add_rms_norm_ref(x, r, w, EPS), 4 * act + HIDDEN * 2))

        # q [T, 24, 256] interleaved with its gate, k [T, 4, 256] after it: views into the qkv projection
        qkv = torch.randn(T, 2 * HQ * HD + 2 * HK * HD, dtype=dt, device=dev)
        q = qkv[:, :2 * HQ * HD].view(T, HQ, 2 * HD)[..., :HD]
        k = qkv[:, 2 * HQ * HD:(2 * HQ + HK) * HD].view(T, HK, HD)
        hw = torch.randn(HD, dtype=dt, device=dev) * 0.1
        freqs, axis = inv_freq(ROTARY, 1e7, dev), mrope_axis(ROTARY, SECTION, dev)
        t = torch.arange(T, device=dev)
        positions = torch.stack([t, t // 3, t % 7])

        def qk_ref(q=q, k=k, hw=hw, freqs=freqs, axis=axis, positions=positions):
            cos, sin = rope_cos_sin(positions, freqs, axis)
            return (apply_rope_ref(rms_norm_ref(q, hw, EPS), cos, sin),
                    apply_rope_ref(rms_norm_ref(k, hw, EPS), cos, sin))

        heads = T * (HQ + HK) * HD * 2
        out.append(_case("qk_norm_rope 24+4x256 rot64", T,
                         lambda q=q, k=k, hw=hw, f=freqs, a=axis, p=positions: qk_norm_rope(q, k, hw, hw, EPS, p, f, a),
                         qk_ref, 2 * heads + 3 * T * 8))
        out.append(_case("rms_norm q heads 24x256 strided", T, lambda q=q, hw=hw: rms_norm(q, hw, EPS),
                         lambda q=q, hw=hw: rms_norm_ref(q, hw, EPS), 2 * T * HQ * HD * 2))

        o = torch.randn(T, GDN_HV, GDN_DV, dtype=dt, device=dev)
        z = torch.randn(T, 2 * GDN_HV * GDN_DV, dtype=dt, device=dev)[:, :GDN_HV * GDN_DV].view(T, GDN_HV, GDN_DV)
        gw = torch.randn(GDN_DV, dtype=dt, device=dev) + 1
        out.append(_case("gated_rms_norm 48x128", T, lambda o=o, z=z, gw=gw: gated_rms_norm(o, z, gw, EPS),
                         lambda o=o, z=z, gw=gw: gated_rms_norm_ref(o, z, gw, EPS), 3 * T * GDN_HV * GDN_DV * 2))

        gate_up = torch.randn(T, 2 * FFN, dtype=dt, device=dev)
        out.append(_case("silu_mul 2x17408", T, lambda g=gate_up: silu_mul(g), lambda g=gate_up: silu_mul_ref(g),
                         3 * T * FFN * 2))
    return out

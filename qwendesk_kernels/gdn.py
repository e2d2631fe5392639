"""Gated DeltaNet: gating, and the gated delta rule over packed sequences with slot-indexed state.

Per v-head h and token t (q, k L2-normalised, q scaled by 1/sqrt(K)):
    S = S * exp(g_t);  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
S is [K, V] in fp32. q/k heads are shared by Hv / Hk consecutive v heads.
State pool [num_slots, Hv, K, V] fp32; a sequence with has_state False starts from zeros.
Slots of one batch must be distinct.

GPU paths:
- prefill, `gated_delta_rule`: fla-core's chunked kernel with states gathered from / scattered to the
  pool; when fla is not importable, a Triton kernel that walks the tokens one by one (correct, slow on
  long prompts).
- decode / speculative verify, `gdn_decode`: one fused kernel from the raw projection rows (conv update
  + SiLU, q/k L2 norm, gating, L delta-rule steps; for up to two sequences the gated output norm too),
  CUDA-graph capturable.
- speculative verify keeps the round's start state in the slot: `gdn_decode(..., verify=VerifyRows)` writes
  no state, only each row's small inputs (raw row, normalised q / k, v, g, beta); once the engine knows how
  many rows were accepted, `gdn_replay` advances every layer's state by those rows in one launch. So a
  sequence's speculation costs one state slot and O(k) rows per layer, never k + 1 copies of its state.
"""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.conv1d import causal_conv1d_ref, conv_token, store_conv_window
from qwendesk_kernels.norm import gated_norm_tile, gated_rms_norm_ref, gated_rms_norm_triton, rounds_weight_product


def gdn_gating_ref(a, b, A_log, dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias) (fp32, log-decay <= 0), beta = sigmoid(b) (fp32)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta):
    """[L, H*, D] inputs -> fp32 [H, L, D] with q/k normalised, q scaled and expanded to Hv heads."""
    rep = v.shape[1] // q.shape[1]
    q = l2norm(q.float()).repeat_interleave(rep, dim=1) * q.shape[-1] ** -0.5
    k = l2norm(k.float()).repeat_interleave(rep, dim=1)
    return q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1), g.T, beta.T


def recurrent_gated_delta_rule_ref(q, k, v, g, beta, state):
    """One sequence, token by token. q,k [L, Hk, K]; v [L, Hv, V]; g, beta [L, Hv]; state [Hv, K, V] fp32.
    Returns (o [L, Hv, V] fp32, final state)."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    S = state.clone()
    out = torch.empty_like(v)
    for t in range(v.shape[1]):
        S = S * g[:, t].exp()[:, None, None]
        kv = (S * k[:, t, :, None]).sum(1)                                  # [H, V]
        delta = (v[:, t] - kv) * beta[:, t, None]
        S = S + k[:, t, :, None] * delta[:, None, :]
        out[:, t] = (S * q[:, t, :, None]).sum(1)
    return out.transpose(0, 1), S


def chunk_gated_delta_rule_ref(q, k, v, g, beta, state, chunk=64):
    """Same function as the recurrent form, computed chunk by chunk with the WY/UT transform."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    H, L, Dk = k.shape
    pad = (-L) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (L + pad) // chunk
    q, k, v = (x.reshape(H, n, chunk, -1) for x in (q, k, v))
    g, beta = g.reshape(H, n, chunk), beta.reshape(H, n, chunk)
    gc = g.cumsum(-1)                                                       # cumulative log decay
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(upper, float("-inf")).exp()
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * decay
    A = A.masked_fill(~torch.ones_like(upper).tril(-1), 0)                  # strictly lower part
    M = torch.eye(chunk, device=q.device) + A
    u = torch.linalg.solve_triangular(M, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(M, kb * gc.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay
    S = state.clone()
    out = torch.empty_like(v)
    for c in range(n):
        v_new = u[:, c] - w[:, c] @ S
        out[:, c] = (q[:, c] * gc[:, c, :, None].exp()) @ S + attn[:, c] @ v_new
        k_dec = k[:, c] * (gc[:, c, -1:, None] - gc[:, c, :, None]).exp()
        S = S * gc[:, c, -1].exp()[:, None, None] + k_dec.transpose(-1, -2) @ v_new
    out = out.reshape(H, n * chunk, -1)[:, :L]
    return out.transpose(0, 1), S


def gated_delta_rule_ref(q, k, v, g, beta, state, slots, cu_seqlens, has_state, snap_tokens=None, snap_slots=None):
    """Packed sequences: q,k [T, Hk, K]; v [T, Hv, V]; g, beta [T, Hv]. Returns o [T, Hv, V] in v's dtype
    and writes each sequence's final state into state[slots[i]]. snap_tokens / snap_slots [N]: where
    snap_tokens[i] > 0, the state after that many tokens of sequence i is also written to state[snap_slots[i]]."""
    out = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    cuts = snap_tokens.tolist() if snap_tokens is not None else [0] * len(bounds)
    for i, slot in enumerate(slots.tolist()):
        s, e = bounds[i], bounds[i + 1]
        S = state[slot] if bool(has_state[i]) else torch.zeros_like(state[slot])
        for lo, hi in ((s, s + cuts[i]), (s + cuts[i], e)) if cuts[i] else ((s, e),):
            fn = recurrent_gated_delta_rule_ref if hi - lo <= 16 else chunk_gated_delta_rule_ref
            o, S = fn(q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi], S)
            out[lo:hi] = o.to(v.dtype)
            if cuts[i] and hi < e:
                state[int(snap_slots[i])] = S
        state[slot] = S
    return out


@dataclass
class VerifyRows:
    """What a verify step keeps of each of its rows for a later replay (one layer's slice, or all layers stacked
    in front): the raw projection row (conv input), the conv outputs as the delta rule takes them (q normalised and
    scaled, k normalised, v), and g, beta."""
    raw: torch.Tensor       # [..., B, L, C] in the activation dtype
    qkv: torch.Tensor       # [..., B, L, C] fp32
    gb: torch.Tensor        # [..., B, L, 2, Hv] fp32: g, beta

    @classmethod
    def allocate(cls, layers: int, B: int, L: int, C: int, Hv: int, dtype, device) -> "VerifyRows":
        return cls(torch.zeros(layers, B, L, C, dtype=dtype, device=device),
                   torch.zeros(layers, B, L, C, device=device), torch.zeros(layers, B, L, 2, Hv, device=device))

    def layer(self, i: int) -> "VerifyRows":
        return VerifyRows(self.raw[i], self.qkv[i], self.gb[i])

    def first(self, B: int, L: int) -> "VerifyRows":
        """The same memory seen as [layers, B, L, ...] (contiguous): the rows of a round of B sequences, L each."""
        def part(t: torch.Tensor) -> torch.Tensor:
            shape = (t.shape[0], B, L, *t.shape[3:])
            return t.view(-1)[:math.prod(shape)].view(shape)
        return VerifyRows(part(self.raw), part(self.qkv), part(self.gb))


def gdn_decode_ref(qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, slots, has_state,
                   verify=None, ba_proj=None, norm=None):
    """The fused decode step composed from the references (arguments: see gdn_decode)."""
    if norm is not None:
        o = gdn_decode_ref(qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, slots, has_state, verify,
                           ba_proj)
        return gated_rms_norm_ref(o, *norm)
    if ba_proj is not None:
        x, w_ba = ba_proj
        b, a = F.linear(x, w_ba).split(w_ba.shape[0] // 2, dim=-1)
    B, (T, C) = slots.shape[0], qkv.shape
    L = T // B
    _, Hv, K, V = ssm_state.shape
    Hk = (C - Hv * V) // (2 * K)
    cu = torch.arange(B + 1, dtype=torch.int32, device=qkv.device) * L
    if verify is None:
        x = causal_conv1d_ref(qkv, conv_weight, conv_state, slots, cu, has_state)
        q, k, v = x.split([Hk * K, Hk * K, Hv * V], dim=-1)
        g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
        return gated_delta_rule_ref(q.reshape(T, Hk, K), k.reshape(T, Hk, K), v.reshape(T, Hv, V), g, beta,
                                    ssm_state, slots, cu, has_state)
    # verify: the same step on copies of the states; the pools keep the round's start state
    local = torch.arange(B, device=qkv.device)
    x = causal_conv1d_ref(qkv, conv_weight, conv_state[slots].clone(), local, cu, has_state)
    q, k, v = x.split([Hk * K, Hk * K, Hv * V], dim=-1)
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
    qn = l2norm(q.float().reshape(T, Hk, K)) * K ** -0.5
    kn = l2norm(k.float().reshape(T, Hk, K))
    verify.raw.copy_(qkv.reshape(B, L, C))
    verify.qkv.copy_(torch.cat([qn.reshape(T, -1), kn.reshape(T, -1), v.float()], dim=-1).reshape(B, L, C))
    verify.gb.copy_(torch.stack([g, beta], dim=1).reshape(B, L, 2, Hv))
    return gated_delta_rule_ref(q.reshape(T, Hk, K), k.reshape(T, Hk, K), v.reshape(T, Hv, V), g, beta,
                                ssm_state[slots].clone(), local, cu, has_state)


def gdn_replay_ref(conv_state, ssm_state, slots, accepted, rows: VerifyRows, snap_rows=None, snap_slots=None):
    """Advance every layer's state of each sequence by its first accepted[i] verify rows (1..L), from the
    round's start state in its slot. conv_state [NL, S, W-1, C], ssm_state [NL, S, Hv, K, V]; rows stacked by
    layer. snap_rows / snap_slots [B]: where snap_rows[i] >= 0, the state after row snap_rows[i] (< accepted[i])
    is also written to slot snap_slots[i] (a rolling prefix-cache snapshot inside the accepted run)."""
    NL, B, L, C = rows.qkv.shape
    Hv, K, V = ssm_state.shape[2:]
    Hk = (C - Hv * V) // (2 * K)
    snaps = snap_rows.tolist() if snap_rows is not None else [-1] * B
    for i, (slot, n) in enumerate(zip(slots.tolist(), accepted.tolist())):
        q, k, v = rows.qkv[:, i].split([Hk * K, Hk * K, Hv * V], dim=-1)
        q = q.reshape(NL, L, Hk, K).repeat_interleave(Hv // Hk, dim=2)
        k = k.reshape(NL, L, Hk, K).repeat_interleave(Hv // Hk, dim=2)
        v = v.reshape(NL, L, Hv, V)
        g, beta = rows.gb[:, i, :, 0], rows.gb[:, i, :, 1]                     # [NL, L, Hv]
        windows = torch.cat([conv_state[:, slot], rows.raw[:, i]], dim=1)      # [NL, W-1+L, C]
        W1 = conv_state.shape[2]
        S = ssm_state[:, slot].clone()
        for t in range(n):
            S = S * g[:, t].exp()[..., None, None]
            delta = (v[:, t] - (S * k[:, t, :, :, None]).sum(2)) * beta[:, t, :, None]
            S = S + k[:, t, :, :, None] * delta[:, :, None, :]
            if t == snaps[i]:
                ssm_state[:, snap_slots[i]] = S
                conv_state[:, snap_slots[i]] = windows[:, t + 1:t + 1 + W1]
        ssm_state[:, slot] = S
        conv_state[:, slot] = windows[:, n:n + W1]


# ---------------------------------------------------------------- Triton building blocks

@triton.jit
def _softplus(x):
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))


@triton.jit
def _l2norm(x):
    return x * tl.rsqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def _delta_rule_step(S, q, k, v, g, beta):
    """One token on a [K, BV] fp32 state tile (q, k [K]; v [BV]); returns (new tile, o [BV])."""
    S = S * tl.exp(g)
    delta = (v - tl.sum(S * k[:, None], axis=0)) * beta
    S = S + k[:, None] * delta[None, :]
    return S, tl.sum(S * q[:, None], axis=0)


# ---------------------------------------------------------------- gating (prefill)

@triton.jit
def _gating_kernel(a, a_row_stride, b, b_row_stride, A_log, dt_bias, g, beta, T, H,
                   BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < T)[:, None] & (cols < H)[None, :]
    av = tl.load(a + rows[:, None] * a_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    bv = tl.load(b + rows[:, None] * b_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    neg_A = -tl.exp(tl.load(A_log + cols, mask=cols < H, other=0.0).to(tl.float32))
    dtb = tl.load(dt_bias + cols, mask=cols < H, other=0.0).to(tl.float32)
    out = rows[:, None] * H + cols[None, :]
    tl.store(g + out, neg_A[None, :] * _softplus(av + dtb[None, :]), mask=mask)
    tl.store(beta + out, tl.sigmoid(bv), mask=mask)


def gdn_gating_triton(a, b, A_log, dt_bias):
    """Triton version of gdn_gating_ref; a, b [T, Hv] (rows may be strided) -> g, beta [T, Hv] fp32."""
    T, H = a.shape
    assert a.stride(1) == 1 and b.stride(1) == 1
    g = torch.empty((T, H), dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    block_t = 32
    _gating_kernel[(triton.cdiv(T, block_t),)](a, a.stride(0), b, b.stride(0), A_log, dt_bias, g, beta, T, H,
                                               BLOCK_T=block_t, BLOCK_H=triton.next_power_of_2(H), num_warps=4)
    return g, beta


def gdn_gating(a, b, A_log, dt_bias):
    if a.is_cuda:
        return gdn_gating_triton(a, b, A_log, dt_bias)
    return gdn_gating_ref(a, b, A_log, dt_bias)


# ---------------------------------------------------------------- prefill

@triton.jit
def _recurrent_kernel(q, k, v, q_row_stride, k_row_stride, v_row_stride, g, beta, g_row_stride, beta_row_stride,
                      A_log, dt_bias, state, slots, has_state, cu_seqlens, snap_tokens, snap_slots, out, scale,
                      HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                      RAW_GATES: tl.constexpr, SNAP: tl.constexpr):
    """Program per (sequence, v head, V block): walks the sequence's tokens with a [K, BV] state tile. The next
    token's inputs are loaded before this token is computed, so their latency hides behind the update."""
    n, hv, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    h = hv // (HV // HK)
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
    live = tl.load(has_state + n) != 0
    ok = tl.arange(0, K)
    ov = i_v * BV + tl.arange(0, BV)
    tile = hv * K * V + ok[:, None] * V + ov[None, :]
    p_S = state + tl.load(slots + n).to(tl.int64) * HV * K * V + tile
    S = tl.where(live, tl.load(p_S), 0.0)
    snap_t = bos - 1                                  # the token after which the state is also saved (none)
    p_snap = p_S
    if SNAP:
        cut = tl.load(snap_tokens + n).to(tl.int64)
        snap_t = tl.where(cut > 0, bos + cut - 1, snap_t)
        p_snap = state + tl.load(snap_slots + n).to(tl.int64) * HV * K * V + tile
    first = tl.maximum(tl.minimum(bos, eos - 1), 0)   # a row that exists even when this sequence has none
    qn = tl.load(q + first * q_row_stride + h * K + ok)
    kn = tl.load(k + first * k_row_stride + h * K + ok)
    vn = tl.load(v + first * v_row_stride + hv * V + ov)
    gn = tl.load(g + first * g_row_stride + hv)
    bn = tl.load(beta + first * beta_row_stride + hv)
    for t in range(bos, eos):
        qt, kt, vt = qn.to(tl.float32), kn.to(tl.float32), vn.to(tl.float32)
        gt, bt = gn.to(tl.float32), bn.to(tl.float32)
        nt = tl.minimum(t + 1, eos - 1)
        qn = tl.load(q + nt * q_row_stride + h * K + ok)
        kn = tl.load(k + nt * k_row_stride + h * K + ok)
        vn = tl.load(v + nt * v_row_stride + hv * V + ov)
        gn = tl.load(g + nt * g_row_stride + hv)
        bn = tl.load(beta + nt * beta_row_stride + hv)
        if RAW_GATES:
            gt = -tl.exp(tl.load(A_log + hv)) * _softplus(gt + tl.load(dt_bias + hv))
            bt = tl.sigmoid(bt)
        S, o = _delta_rule_step(S, _l2norm(qt) * scale, _l2norm(kt), vt, gt, bt)
        tl.store(out + (t * HV + hv) * V + ov, o.to(out.dtype.element_ty))
        if SNAP:
            if t == snap_t:
                tl.store(p_snap, S)
    tl.store(p_S, S)


def recurrent_gated_delta_rule_triton(q, k, v, g, beta, state, slots, cu_seqlens, has_state, A_log=None,
                                      dt_bias=None, snap_tokens=None, snap_slots=None):
    """Triton version of gated_delta_rule_ref (same arguments and effects), token by token. Given A_log and
    dt_bias, g and beta are the raw a and b projections and the gating is applied in the kernel."""
    T, HK, K = q.shape
    _, HV, V = v.shape
    N = slots.shape[0]
    assert q.stride(1) == k.stride(1) == K and v.stride(1) == V and q.stride(2) == k.stride(2) == v.stride(2) == 1
    assert g.stride(1) == 1 and beta.stride(1) == 1 and state.is_contiguous()
    out = torch.empty((T, HV, V), dtype=v.dtype, device=v.device)
    raw_gates = A_log is not None
    snap = snap_tokens is not None
    block_v = min(V, 32)
    _recurrent_kernel[(N, HV, V // block_v)](
        q, k, v, q.stride(0), k.stride(0), v.stride(0), g, beta, g.stride(0), beta.stride(0),
        A_log if raw_gates else g, dt_bias if raw_gates else g, state, slots, has_state.view(torch.uint8),
        cu_seqlens, snap_tokens if snap else cu_seqlens, snap_slots if snap else slots, out, K ** -0.5,
        HK=HK, HV=HV, K=K, V=V, BV=block_v, RAW_GATES=raw_gates, SNAP=snap, num_warps=4)
    return out


# Chunks up to this many tokens take the recurrent kernel: one launch per layer, where fla's ~8 launches and Python
# wrappers cost ~1.8 ms of host time per layer on the H200 machine, more than the recurrent walk of a short chunk.
# Snapshots inside a prefill step (snap_tokens) are only taken on this path: the scheduler splits longer steps.
RECURRENT_MAX_TOKENS = 512


@functools.cache
def _fla_chunk():
    """fla-core's chunked gated delta rule, or None when fla (or its dependency einops) is not importable."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


_fla_meta_last: tuple = (None, None)


def _fla_meta(cu_seqlens):
    """(int64 cu_seqlens, its host copy, fla's chunk index) for a batch, made once and reused by every layer of
    the forward (they all pass the batch's one cu_seqlens tensor). Without it each layer would convert again, and
    fla's identity-keyed caches would miss, and size its chunk index on the host: a device sync per layer.
    One (key, value) tuple, read once: two engines in two threads each get their own batch's entry."""
    global _fla_meta_last
    key, meta = _fla_meta_last
    if key is not cu_seqlens:
        from fla.ops.utils.index import prepare_chunk_indices
        cu_long = cu_seqlens.long()
        cu_cpu = cu_long.cpu()
        meta = dict(cu_seqlens=cu_long, cu_seqlens_cpu=cu_cpu,
                    chunk_indices=prepare_chunk_indices(cu_long, 64, cu_seqlens_cpu=cu_cpu))
        _fla_meta_last = (cu_seqlens, meta)
    return meta


def gated_delta_rule_fla(q, k, v, g, beta, state, slots, cu_seqlens, has_state):
    """gated_delta_rule_ref's contract on fla's varlen chunked kernel (GVA native: Hv > Hk needs no repeat).
    Not graph capturable (fla sizes its chunk index on the host)."""
    init = torch.where(has_state[:, None, None, None], state[slots], 0.0)
    o, final = _fla_chunk()(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0), beta.unsqueeze(0),
                            scale=q.shape[-1] ** -0.5, initial_state=init, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, **_fla_meta(cu_seqlens))
    state[slots] = final
    return o[0]


def gated_delta_rule(q, k, v, g, beta, state, slots, cu_seqlens, has_state, snap_tokens=None, snap_slots=None):
    """Prefill: on CUDA fla's chunked kernel, or the Triton recurrent kernel for short chunks (or without fla);
    the torch reference elsewhere. snap_tokens / snap_slots: see gated_delta_rule_ref (steps of at most
    RECURRENT_MAX_TOKENS tokens)."""
    if not q.is_cuda:
        return gated_delta_rule_ref(q, k, v, g, beta, state, slots, cu_seqlens, has_state, snap_tokens, snap_slots)
    if _fla_chunk() is not None and q.shape[0] > RECURRENT_MAX_TOKENS:
        assert snap_tokens is None, "in-step snapshots need a step of at most RECURRENT_MAX_TOKENS tokens"
        return gated_delta_rule_fla(q, k, v, g, beta, state, slots, cu_seqlens, has_state)
    return recurrent_gated_delta_rule_triton(q, k, v, g, beta, state, slots, cu_seqlens, has_state,
                                             snap_tokens=snap_tokens, snap_slots=snap_slots)


# ---------------------------------------------------------------- fused decode / verify

@triton.jit
def _ba_proj(x_row, w_b_row, w_a_row, H: tl.constexpr, BH: tl.constexpr):
    """(x . w_b, x . w_a) over H in fp32, rounded to x's dtype like a separate projection's output."""
    acc_b = tl.zeros((BH,), tl.float32)
    acc_a = tl.zeros((BH,), tl.float32)
    for h0 in tl.static_range(0, H, BH):                    # unrolled: every load is issued before the sums
        offs = h0 + tl.arange(0, BH)
        ok = offs < H
        xv = tl.load(x_row + offs, mask=ok, other=0).to(tl.float32)
        acc_b += xv * tl.load(w_b_row + offs, mask=ok, other=0).to(tl.float32)
        acc_a += xv * tl.load(w_a_row + offs, mask=ok, other=0).to(tl.float32)
    dtype = x_row.dtype.element_ty
    return tl.sum(acc_b).to(dtype).to(tl.float32), tl.sum(acc_a).to(dtype).to(tl.float32)


@triton.jit
def _norm_tile(out, z, z_row_stride, row, head, HV: tl.constexpr, V: tl.constexpr):
    """(pointers, fp32 values) of one output row of one v head as a [1, V] tile, and its gate's values."""
    cols = tl.arange(0, V)[None, :]
    p_o = out + (row * HV + head) * V + cols
    return p_o, tl.load(p_o, cache_modifier=".cg").to(tl.float32), tl.load(z + row * z_row_stride + head * V + cols) \
        .to(tl.float32)


@triton.jit
def _decode_kernel(qkv, qkv_row_stride, a, a_row_stride, b, b_row_stride, x, x_row_stride, w_ba, conv_w, conv_state,
                   conv_slot_stride, conv_row_stride, A_log, dt_bias, ssm, slots, has_state, counters, out, keep_raw,
                   keep_qkv, keep_gb, z, z_row_stride, norm_w, eps, scale, HK: tl.constexpr, HV: tl.constexpr,
                   K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, W: tl.constexpr,
                   BV: tl.constexpr, VERIFY: tl.constexpr, H: tl.constexpr, BH: tl.constexpr, BA_PROJ: tl.constexpr,
                   NORM: tl.constexpr, ROUND_WY: tl.constexpr, PDL: tl.constexpr):
    """Program per (sequence, v head, V block) holding a [K, BV] fp32 state tile. Each program convolves the
    q/k channels of its qk head and its own v channels itself (a few KB, L2-resident) rather than reading
    them from a separate conv kernel. With BA_PROJ it also projects its head's b and a from the layer input x
    (two dot products of H; the weight rows are shared by the head's programs through L2) instead of reading them:
    two launches fewer per layer than a separate 96-row GEMV. With NORM the last programs apply the gated RMSNorm to
    the outputs in place (o / rms(o) * w * silu(z)): one launch fewer per layer.
    With VERIFY the states stay as they are and each row's replay inputs are kept instead (VerifyRows): every
    program its own v columns, the first program of each qk head the head's q / k, the first of each v head g and
    beta."""
    pdl.enter(PDL)
    i_b, i_hv, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // HK)
    C = 2 * HK * K + HV * V
    slot = tl.load(slots + i_b).to(tl.int64)
    live = tl.load(has_state + i_b) != 0
    ok = tl.arange(0, K)
    ov = i_v * BV + tl.arange(0, BV)
    p_S = ssm + (slot * HV + i_hv) * K * V + ok[:, None] * V + ov[None, :]
    S = tl.where(live, tl.load(p_S), 0.0)          # issued first: its latency overlaps the conv below
    cq = i_h * K + ok
    o2 = tl.arange(0, 2 * K)
    cqk = tl.where(o2 < K, i_h * K + o2, HK * K + i_h * K + o2 - K)     # the head's q and k channels, one [2 K] vector
    cv = 2 * HK * K + i_hv * V + ov
    all_k = ok < K
    all_v = ov < V
    x_rows = qkv + i_b.to(tl.int64) * L * qkv_row_stride
    win = conv_state + slot * conv_slot_stride
    neg_A = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    dtb = tl.load(dt_bias + i_hv).to(tl.float32)
    if BA_PROJ and L > 1:       # a verify's rows' b and a first: their loads are not held behind a row's stores
        rows_b = tl.zeros((LP,), tl.float32)
        rows_a = tl.zeros((LP,), tl.float32)
        for t in tl.static_range(L):
            b_t, a_t = _ba_proj(x + (i_b.to(tl.int64) * L + t) * x_row_stride, w_ba + i_hv * H,
                                w_ba + (HV + i_hv) * H, H, BH)
            rows_b = tl.where(tl.arange(0, LP) == t, b_t, rows_b)
            rows_a = tl.where(tl.arange(0, LP) == t, a_t, rows_a)
    # Each row's conv is loaded one row ahead, before the stores of the row before it.
    q_next = conv_token(x_rows, qkv_row_stride, win, conv_row_stride, conv_w, cq, all_k, live, 0, W, True)
    k_next = conv_token(x_rows, qkv_row_stride, win, conv_row_stride, conv_w, HK * K + cq, all_k, live, 0, W, True)
    v_next = conv_token(x_rows, qkv_row_stride, win, conv_row_stride, conv_w, cv, all_v, live, 0, W, True)
    for t in tl.static_range(L):
        q, k, v = q_next, k_next, v_next
        if VERIFY:          # the raw inputs it keeps: loaded before its arithmetic, arrived by its stores
            raw_qk = tl.load(x_rows + t * qkv_row_stride + cqk)
            raw_v = tl.load(x_rows + t * qkv_row_stride + cv)
        if t + 1 < L:
            q_next = conv_token(x_rows, qkv_row_stride, win, conv_row_stride, conv_w, cq, all_k, live, t + 1, W, True)
            k_next = conv_token(x_rows, qkv_row_stride, win, conv_row_stride, conv_w, HK * K + cq, all_k, live, t + 1,
                                W, True)
            v_next = conv_token(x_rows, qkv_row_stride, win, conv_row_stride, conv_w, cv, all_v, live, t + 1, W, True)
        row = i_b.to(tl.int64) * L + t
        if BA_PROJ and L > 1:
            b_t = tl.sum(tl.where(tl.arange(0, LP) == t, rows_b, 0.0))     # exact: one value and zeros
            a_t = tl.sum(tl.where(tl.arange(0, LP) == t, rows_a, 0.0))
        elif BA_PROJ:
            b_t, a_t = _ba_proj(x + row * x_row_stride, w_ba + i_hv * H, w_ba + (HV + i_hv) * H, H, BH)
        else:
            a_t = tl.load(a + row * a_row_stride + i_hv).to(tl.float32)
            b_t = tl.load(b + row * b_row_stride + i_hv).to(tl.float32)
        g = neg_A * _softplus(a_t + dtb)
        beta = tl.sigmoid(b_t)
        qn = _l2norm(q) * scale
        kn = _l2norm(k)
        S, o = _delta_rule_step(S, qn, kn, v, g, beta)
        tl.store(out + (row * HV + i_hv) * V + ov, o.to(out.dtype.element_ty))
        if VERIFY:
            tl.store(keep_qkv + row * C + cv, v)
            tl.store(keep_raw + row * C + cv, raw_v)
            first_of_head = (i_hv % (HV // HK) == 0) & (i_v == 0)
            if first_of_head:
                tl.store(keep_qkv + row * C + cq, qn)
                tl.store(keep_qkv + row * C + HK * K + cq, kn)
                tl.store(keep_raw + row * C + cqk, raw_qk)
            if i_v == 0:
                tl.store(keep_gb + row * 2 * HV + i_hv, g)
                tl.store(keep_gb + row * 2 * HV + HV + i_hv, beta)
    if not VERIFY:
        tl.store(p_S, S)
        # Conv windows. The v channels belong to this program alone.
        store_conv_window(x_rows, qkv_row_stride, win, conv_row_stride, win, conv_row_stride, cv, all_v, live, L - 1,
                          W)
    # An arrival counter per group, reset by its last program. A step: the q/k channels are read by every program of
    # the (sequence, qk head) group, so the last of them stores their conv window (nothing is overwritten while still
    # read), and it applies the gated norm to the group's v heads. A verify has no window to store, and its rows are
    # serial in that last program: there each v head's last program normalises the head's rows (L tiles, not 3 L).
    # The norm reads outputs that were stored before the others arrived.
    tl.debug_barrier()
    NH: tl.constexpr = 1 if VERIFY else HV // HK          # v heads whose rows the last program normalises
    if VERIFY:
        group = counters + i_b * HV + i_hv
        last = tl.atomic_add(group, 1) == V // BV - 1
        first_head = i_hv
    else:
        group = counters + i_b * HV + i_h
        last = tl.atomic_add(group, 1) == (HV // HK) * (V // BV) - 1
        first_head = i_h * (HV // HK)
        qk_mask = tl.where(last, o2 < 2 * K, False)
        store_conv_window(x_rows, qkv_row_stride, win, conv_row_stride, win, conv_row_stride, cqk, qk_mask, live,
                          L - 1, W)
    if NORM:
        if last:        # row by row, a [1, V] tile as a plain step has: a [rows, V] tile sums in another order
            cols = tl.arange(0, V)
            w = tl.load(norm_w + cols).to(tl.float32)
            p_o_next, o_next, z_next = _norm_tile(out, z, z_row_stride, i_b.to(tl.int64) * L, first_head, HV, V)
            for n in tl.static_range(L * NH):       # each tile's loads issued before the store of the one before
                p_o, o_h, z_h = p_o_next, o_next, z_next
                if n + 1 < L * NH:
                    p_o_next, o_next, z_next = _norm_tile(out, z, z_row_stride, i_b.to(tl.int64) * L + (n + 1) // NH,
                                                          first_head + (n + 1) % NH, HV, V)
                tl.store(p_o, gated_norm_tile(o_h, z_h, w, eps, V, ROUND_WY, out.dtype.element_ty)
                         .to(out.dtype.element_ty))
    tl.store(group, 0, mask=last)


_arrival_counters: dict = {}


def _counters(device, n):
    """Zeroed int32 arrival counters for the decode kernel (each launch leaves them zero again)."""
    buf = _arrival_counters.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _arrival_counters[device] = buf
    return buf


FUSED_NORM_MAX_B = 2           # the gated norm inside the step up to this batch; a kernel of its own above
# A verify's rows and a replay must give the bits of plain steps (exact speculation), yet each is another compile of
# the delta rule (L rows unrolled, or the replay kernel): with FP fusion on, the compiler chose fused multiply-adds
# differently between them (2026-12-07: 4-17 of 294,912 outputs 1 ulp off at B = 8, 6 rows, row 0 included, with
# the same layouts). Without it every product is rounded where the code says, the same in each compile.
STEP_OPTIONS = dict(num_warps=4, enable_fp_fusion=False)


def decode_block_v(B: int) -> int:
    """V columns per program of the decode step and of the replay for B sequences (the same tile in both: a sum over
    K runs in another order in another tile). 32 up to 4 sequences, else 64 (48 layers on the H200, 4 warps: 19.8 µs
    per layer at B = 8 with 64 against 22.8 with 32, docs/performance.md, seventh session; with the norm fused at
    B = 1, 32 took 31.0 µs per layer with the GEMVs around it where 16 took 31.5 and 64 32.6, tenth session)."""
    return 32 if B <= 4 else 64


def gdn_decode_triton(qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, slots, has_state,
                      verify=None, ba_proj=None, norm=None, block_v=None):
    """Triton version of gdn_decode (block_v: V columns per program; default decode_block_v's). The gated norm runs
    in the step's last programs up to FUSED_NORM_MAX_B sequences, else as its own kernel after it."""
    B, (T, C) = slots.shape[0], qkv.shape
    if norm is not None and B > FUSED_NORM_MAX_B:
        o = gdn_decode_triton(qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, slots, has_state,
                              verify, ba_proj, block_v=block_v)
        return gated_rms_norm_triton(o, *norm)
    if ba_proj is not None:
        x, w_ba = ba_proj
        assert x.stride(1) == 1 and w_ba.is_contiguous() and w_ba.shape == (2 * ssm_state.shape[1], x.shape[1])
        a = b = qkv                                 # (not read)
        H = x.shape[1]
    else:
        x = w_ba = qkv                              # (not read)
        H = 1
    _, HV, K, V = ssm_state.shape
    HK = (C - HV * V) // (2 * K)
    W = conv_weight.shape[1]
    assert qkv.stride(1) == a.stride(1) == b.stride(1) == 1 and conv_state.stride(2) == 1
    assert conv_weight.is_contiguous() and ssm_state.is_contiguous()
    assert verify is None or all(t.is_contiguous() for t in (verify.raw, verify.qkv, verify.gb))
    out = torch.empty((T, HV, V), dtype=qkv.dtype, device=qkv.device)
    if norm is not None:
        z, norm_w, eps = norm
        assert z.shape == out.shape and z.stride(2) == 1 and z.stride(1) == V and norm_w.shape == (V,)
        z_row_stride, round_wy = z.stride(0), rounds_weight_product(norm_w, out)
    else:
        z, norm_w, eps, z_row_stride, round_wy = out, out, 0.0, 0, False     # (not read)
    block_v = min(V, block_v or decode_block_v(B))
    keep = (verify.raw, verify.qkv, verify.gb) if verify is not None else (out, out, out)
    _decode_kernel[(B, HV, V // block_v)](
        qkv, qkv.stride(0), a, a.stride(0), b, b.stride(0), x, x.stride(0), w_ba, conv_weight, conv_state,
        conv_state.stride(0), conv_state.stride(1), A_log, dt_bias, ssm_state, slots, has_state.view(torch.uint8),
        _counters(qkv.device, B * HV), out, *keep, z, z_row_stride,
        norm_w, eps, K ** -0.5, HK=HK, HV=HV, K=K, V=V, L=T // B, LP=triton.next_power_of_2(T // B), W=W, BV=block_v,
        VERIFY=verify is not None, H=H,
        BH=min(1024, triton.next_power_of_2(H)), BA_PROJ=ba_proj is not None, NORM=norm is not None,
        ROUND_WY=round_wy, **STEP_OPTIONS, **pdl.launch_args(qkv.device))
    return out


@triton.jit
def _replay_kernel(ssm, ssm_layer_stride, slots, accepted, snap_rows, snap_slots, qkv, qkv_layer_stride, gb,
                   gb_layer_stride, B,
                   HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                   BV: tl.constexpr):
    """Program per (layer x sequence, v head, V block): the [K, BV] state tile advanced by the sequence's accepted
    rows (the same delta-rule step as the verify), written back; the snapshot row's state also to its slot."""
    pid = tl.program_id(0)
    i_l, i_b = pid // B, pid % B
    i_hv, i_v = tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // HK)
    C = 2 * HK * K + HV * V
    slot = tl.load(slots + i_b).to(tl.int64)
    n = tl.load(accepted + i_b)
    snap_t = tl.load(snap_rows + i_b)
    snap_slot = tl.load(snap_slots + i_b).to(tl.int64)
    ok = tl.arange(0, K)
    ov = i_v * BV + tl.arange(0, BV)
    tile = ok[:, None] * V + ov[None, :]
    layer = ssm + i_l.to(tl.int64) * ssm_layer_stride
    p_S = layer + (slot * HV + i_hv) * K * V + tile
    S = tl.load(p_S)
    rows = qkv + i_l.to(tl.int64) * qkv_layer_stride + i_b * L * C
    gbs = gb + i_l.to(tl.int64) * gb_layer_stride + i_b * L * 2 * HV
    for t in tl.static_range(L):
        if t < n:
            k = tl.load(rows + t * C + HK * K + i_h * K + ok)
            v = tl.load(rows + t * C + 2 * HK * K + i_hv * V + ov)
            g = tl.load(gbs + t * 2 * HV + i_hv)
            beta = tl.load(gbs + t * 2 * HV + HV + i_hv)
            S, _ = _delta_rule_step(S, k, k, v, g, beta)
            if t == snap_t:
                tl.store(layer + (snap_slot * HV + i_hv) * K * V + tile, S)
    tl.store(p_S, S)


def _replay_windows(conv_state, slots, accepted, raw, snap_rows, snap_slots):
    """Conv windows after the accepted rows (and after each snapshot row): the last W-1 raw inputs up to there, from
    the round's start window followed by the verify rows. Gathers only: no sync, graph capturable."""
    NL, B, L, C = raw.shape
    W1 = conv_state.shape[2]
    ext = torch.cat([conv_state[:, slots], raw.to(conv_state.dtype)], dim=2)            # [NL, B, W-1+L, C]
    offs = torch.arange(W1, device=raw.device)

    def window_after(count):                                                            # [NL, B, W-1, C]
        idx = (count.long()[:, None] + offs)[None, :, :, None].expand(NL, B, W1, C)
        return ext.gather(2, idx)

    if snap_rows is not None:
        conv_state[:, snap_slots] = window_after(snap_rows.clamp(min=0) + 1)
    conv_state[:, slots] = window_after(accepted)


def gdn_replay_triton(conv_state, ssm_state, slots, accepted, rows: VerifyRows, snap_rows=None, snap_slots=None):
    """Triton version of gdn_replay_ref: one launch for every layer's recurrent state, gathers for the windows.
    Where snap_rows is -1, snap_slots must name a slot nothing reads (the scratch slot): its window is written."""
    NL, B, L, C = rows.qkv.shape
    HV, K, V = ssm_state.shape[2:]
    HK = (C - HV * V) // (2 * K)
    assert ssm_state.is_contiguous() and rows.qkv[0].is_contiguous() and rows.gb[0].is_contiguous()
    if snap_rows is None:
        snap_rows = torch.full_like(accepted, -1)
        snap_slots_k = slots
    else:
        snap_slots_k = snap_slots
    block_v = min(V, decode_block_v(B))
    _replay_kernel[(NL * B, HV, V // block_v)](
        ssm_state, ssm_state.stride(0), slots, accepted, snap_rows, snap_slots_k, rows.qkv, rows.qkv.stride(0),
        rows.gb, rows.gb.stride(0), B,
        HK=HK, HV=HV, K=K, V=V, L=L, BV=block_v, **STEP_OPTIONS)
    _replay_windows(conv_state, slots, accepted, rows.raw,
                    None if snap_slots is None else snap_rows, snap_slots)


def gdn_replay(conv_state, ssm_state, slots, accepted, rows: VerifyRows, snap_rows=None, snap_slots=None):
    """After a verify step: advance each sequence's GDN state, in every layer, by its accepted[i] rows (int32,
    1..L) from the start state its slot kept, and its conv window likewise. conv_state [NL, S, W-1, C] and
    ssm_state [NL, S, Hv, K, V] are the layer-stacked pools, rows the layer-stacked VerifyRows of the step.
    snap_rows / snap_slots [B] (optional): also save the states after row snap_rows[i] into slot snap_slots[i]
    (-1: none; on CUDA that sequence's snap_slots entry must then be a slot nothing reads). Triton on CUDA (graph
    capturable), the reference elsewhere."""
    fn = gdn_replay_triton if ssm_state.is_cuda else gdn_replay_ref
    return fn(conv_state, ssm_state, slots, accepted, rows, snap_rows, snap_slots)


def gdn_decode(qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, slots, has_state,
               verify=None, ba_proj=None, norm=None):
    """One decode (L=1) or verify (L=k+1) step of a GDN layer for B sequences of L tokens each.

    qkv [B*L, conv_dim] pre-conv projection rows, a / b [B*L, Hv] (rows may be strided slices of the fused
    in_proj output); conv_weight [conv_dim, W]; conv_state [num_slots, W-1, conv_dim]; A_log, dt_bias [Hv] fp32;
    ssm_state [num_slots, Hv, K, V] fp32; slots [B] int64 in any order; has_state [B] bool.
    Returns o [B*L, Hv, V] in qkv's dtype and advances both states of each slot by the L tokens. With verify
    (a VerifyRows of this layer, [B, L, ...]) the states are left as they are and each row's replay inputs are
    kept there instead (gdn_replay applies the accepted ones).
    ba_proj = (x [B*L, H], w_ba [2 Hv, H]): a and b (then None) are the projections x @ w_ba^T (b rows first),
    made inside the step. norm = (z [B*L, Hv, V], weight [V], eps): o is returned through the gated RMSNorm
    (gated_rms_norm(o, z, weight, eps)). Triton on CUDA (graph capturable), the composed references elsewhere."""
    fn = gdn_decode_triton if qkv.is_cuda else gdn_decode_ref
    return fn(qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, slots, has_state, verify, ba_proj,
              norm)

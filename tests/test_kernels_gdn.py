"""Gated DeltaNet kernels (causal conv1d, gating, gated delta rule, fused decode) against the torch references.

CPU: the Triton kernels run in the interpreter on small fp32/fp16 shapes. GPU (`gpu` mark): bf16 at the 27B
shapes (16 qk heads, 48 v heads, head dim 128, conv width 4), fla's chunked prefill, CUDA-graph replay.
State slots that a kernel must neither read (has_state False) nor write (not in the batch) hold NaN.
"""

import functools

import pytest
import torch

from qwendesk_kernels.conv1d import (causal_conv1d, causal_conv1d_ref, causal_conv1d_triton, causal_conv1d_update,
                            causal_conv1d_update_ref, causal_conv1d_update_triton)
from qwendesk_kernels.gdn import (VerifyRows, _fla_chunk, decode_block_v, gated_delta_rule,
                         gated_delta_rule_fla, gated_delta_rule_ref, gdn_decode, gdn_decode_ref, gdn_decode_triton,
                         gdn_gating, gdn_gating_ref, gdn_gating_triton, gdn_replay, gdn_replay_ref, gdn_replay_triton,
                         recurrent_gated_delta_rule_triton)
from qwendesk_kernels.norm import gated_rms_norm_triton

W = 4
SHAPE_27B = dict(Hk=16, Hv=48, K=128, V=128)


def batch_meta(lens, has_state, num_slots, device):
    """cu_seqlens, slots (out of order, not 0..N-1), has_state for sequences of the given lengths."""
    N = len(lens)
    slots = torch.randperm(num_slots)[:N].to(device)
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    return cu, slots, torch.tensor(has_state, device=device)


def poison_pool(pool, slots, has_state):
    """NaN in every slot the batch must not touch and in the slots of sequences without state."""
    pool = pool.clone()
    used = torch.zeros(pool.shape[0], dtype=torch.bool)
    used[slots.cpu()] = True
    pool[~used.to(pool.device)] = float("nan")
    pool[slots[~has_state]] = float("nan")
    return pool


def assert_untouched(pool, slots):
    """Every slot outside the batch still holds its NaN poison."""
    others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
    others[slots] = False
    assert pool[others].isnan().all()


def check_pool(actual, expected, slots, tol):
    """Batch slots close to the reference (a verify leaves a stateless sequence's poison: NaN in both), the others
    untouched."""
    torch.testing.assert_close(actual[slots], expected[slots], atol=tol, rtol=tol, equal_nan=True)
    assert_untouched(actual, slots)


def rel_err(actual, expected):
    a, e = actual.float(), expected.float()
    assert torch.isfinite(a).all()
    return ((a - e).norm() / e.norm().clamp_min(1e-12)).item()


def projection_rows(T, C, Hv, dtype, device):
    """qkv [T, C], a, b [T, Hv] as column slices of one fused projection output (strided rows, like the model)."""
    proj = torch.randn(T, C + 128 + 2 * Hv, dtype=dtype, device=device)
    return proj[:, :C], proj[:, C + 128 + Hv:], proj[:, C + 128:C + 128 + Hv]


def decode_inputs(B, L, Hk, Hv, K, V, dtype, device, has_state=None, num_slots=None):
    C = 2 * Hk * K + Hv * V
    num_slots = num_slots or B + 3
    has_state = has_state if has_state is not None else [i % 3 != 1 for i in range(B)]
    _, slots, live = batch_meta([L] * B, has_state, num_slots, device)
    qkv, a, b = projection_rows(B * L, C, Hv, dtype, device)
    conv_state = poison_pool(torch.randn(num_slots, W - 1, C, dtype=dtype, device=device), slots, live)
    ssm_state = poison_pool(0.1 * torch.randn(num_slots, Hv, K, V, device=device), slots, live)
    return dict(qkv=qkv, a=a, b=b, conv_weight=0.5 * torch.randn(C, W, dtype=dtype, device=device),
                conv_state=conv_state, A_log=torch.empty(Hv, device=device).uniform_(0.05, 4).log(),
                dt_bias=0.5 * torch.randn(Hv, device=device), ssm_state=ssm_state, slots=slots, has_state=live)


def nan_rows(B, L, C, Hv, dtype, device) -> VerifyRows:
    rows = VerifyRows.allocate(1, B, L, C, Hv, dtype, device).layer(0)
    for t in (rows.raw, rows.qkv, rows.gb):
        t.fill_(float("nan"))
    return rows


def run_decode(fn, inp, verify, **kw):
    """Run a decode implementation on copies of the pools; returns (o, conv_state, ssm_state, verify rows or None).
    verify: a verify step (the states stay, each row's replay inputs are kept)."""
    x = dict(inp, conv_state=inp["conv_state"].clone(), ssm_state=inp["ssm_state"].clone())
    B, (T, C) = x["slots"].shape[0], x["qkv"].shape
    rows = nan_rows(B, T // B, C, x["ssm_state"].shape[1], x["qkv"].dtype, x["qkv"].device) if verify else None
    o = fn(**x, verify=rows, **kw)
    return o, x["conv_state"], x["ssm_state"], rows


def assert_rows_close(got: VerifyRows, want: VerifyRows, tol):
    for a, b in ((got.raw, want.raw), (got.qkv, want.qkv), (got.gb, want.gb)):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def prefill_inputs(lens, has_state, Hk, Hv, K, V, dtype, device):
    T = sum(lens)
    cu, slots, live = batch_meta(lens, has_state, len(lens) + 3, device)
    q = torch.randn(T, Hk, K, dtype=dtype, device=device)
    k = torch.randn(T, Hk, K, dtype=dtype, device=device)
    v = torch.randn(T, Hv, V, dtype=dtype, device=device)
    g, beta = gdn_gating_ref(torch.randn(T, Hv, device=device), torch.randn(T, Hv, device=device),
                             torch.empty(Hv, device=device).uniform_(0.05, 4).log(), torch.zeros(Hv, device=device))
    state = poison_pool(0.1 * torch.randn(len(lens) + 3, Hv, K, V, device=device), slots, live)
    return (q, k, v, g, beta), state, slots, cu, live


# ---------------------------------------------------------------- CPU (Triton interpreter), small shapes

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_conv1d_varlen(dtype):
    torch.manual_seed(0)
    lens, C = [1, 70, 5, 2], 48          # length 1; 32-row tiles with and without a sequence start
    cu, slots, live = batch_meta(lens, [True, False, True, False], 8, "cpu")
    x = torch.randn(sum(lens), C + 16, dtype=dtype)[:, 8:8 + C]
    weight = torch.randn(C, W, dtype=dtype)
    state = poison_pool(torch.randn(8, W - 1, C, dtype=dtype), slots, live)
    s_ref, s_tri = state.clone(), state.clone()
    y_ref = causal_conv1d_ref(x, weight, s_ref, slots, cu, live)
    y_tri = causal_conv1d_triton(x, weight, s_tri, slots, cu, live)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(y_tri, y_ref, atol=tol, rtol=tol)
    check_pool(s_tri, s_ref, slots, tol)


@pytest.mark.parametrize("L, steps", [(1, False), (4, True)])
def test_causal_conv1d_update(L, steps):
    torch.manual_seed(1)
    B, C = 3, 40
    _, slots, live = batch_meta([L] * B, [True, False, True], 6, "cpu")
    x = torch.randn(B * L, C + 8)[:, :C]
    weight = torch.randn(C, W)
    state = poison_pool(torch.randn(6, W - 1, C), slots, live)
    s_ref, s_tri = state.clone(), state.clone()
    st_ref, st_tri = (torch.full((B, L, W - 1, C), float("nan")) for _ in range(2)) if steps else (None, None)
    y_ref = causal_conv1d_update_ref(x, weight, s_ref, slots, live, st_ref)
    y_tri = causal_conv1d_update_triton(x, weight, s_tri, slots, live, st_tri)
    torch.testing.assert_close(y_tri, y_ref, atol=1e-5, rtol=1e-5)
    check_pool(s_tri, s_ref, slots, 1e-6)
    if steps:
        torch.testing.assert_close(st_tri, st_ref)
        s_once = state.clone()                          # the ref in one call agrees with the ref token by token
        torch.testing.assert_close(causal_conv1d_update_ref(x, weight, s_once, slots, live), y_ref)


def test_gdn_gating():
    torch.manual_seed(2)
    T, H = 37, 6
    a, b = torch.randn(T, 2 * H + 5)[:, :H], torch.randn(T, 2 * H + 5)[:, H:2 * H]
    A_log, dt_bias = torch.rand(H).add(0.1).log(), torch.randn(H)
    a[0, 0] = 30.0                                        # softplus's linear branch
    for got, want in zip(gdn_gating_triton(a, b, A_log, dt_bias), gdn_gating_ref(a, b, A_log, dt_bias)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert gdn_gating(a, b, A_log, dt_bias)[0].dtype == torch.float32


@pytest.mark.parametrize("Hk, Hv", [(2, 2), (1, 3)])
@pytest.mark.parametrize("raw_gates", [False, True])
def test_recurrent_gated_delta_rule_varlen(Hk, Hv, raw_gates):
    torch.manual_seed(3)
    K = V = 16
    lens = [1, 20, 6]                                     # 20 > 16: the reference takes its chunked path
    (q, k, v, g, beta), state, slots, cu, live = prefill_inputs(lens, [False, True, True], Hk, Hv, K, V,
                                                                torch.float32, "cpu")
    s_ref, s_tri = state.clone(), state.clone()
    if raw_gates:                                          # the kernel applies the gating to raw a, b
        a, b = torch.randn(sum(lens), Hv), torch.randn(sum(lens), Hv)
        A_log, dt_bias = torch.rand(Hv).add(0.1).log(), torch.randn(Hv)
        g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
        o_tri = recurrent_gated_delta_rule_triton(q, k, v, a, b, s_tri, slots, cu, live, A_log, dt_bias)
    else:
        o_tri = recurrent_gated_delta_rule_triton(q, k, v, g, beta, s_tri, slots, cu, live)
    o_ref = gated_delta_rule_ref(q, k, v, g, beta, s_ref, slots, cu, live)
    torch.testing.assert_close(o_tri, o_ref, atol=1e-4, rtol=1e-4)
    check_pool(s_tri, s_ref, slots, 1e-4)


def test_snapshot_inside_a_prefill_step():
    """snap_tokens: the state after the first n tokens of a sequence also lands in a snapshot slot, equal to
    running those n tokens alone; outputs and final states are unchanged. Reference and Triton kernel."""
    torch.manual_seed(4)
    lens, cuts = [1, 20, 30, 6], [0, 18, 7, 0]
    (q, k, v, g, beta), state, slots, cu, live = prefill_inputs(lens, [False, True, True, False], 1, 2, 16, 16,
                                                                torch.float32, "cpu")
    free = [i for i in range(state.shape[0]) if i not in slots.tolist()]
    snap_slots = torch.tensor([free[0], free[0], free[1], free[0]])
    snap_tokens = torch.tensor(cuts, dtype=torch.int32)
    plain = state.clone()
    o_plain = gated_delta_rule_ref(q, k, v, g, beta, plain, slots, cu, live)
    for fn in (gated_delta_rule_ref, recurrent_gated_delta_rule_triton):
        s = state.clone()
        o = fn(q, k, v, g, beta, s, slots, cu, live, snap_tokens=snap_tokens, snap_slots=snap_slots)
        torch.testing.assert_close(o, o_plain, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(s[slots], plain[slots], atol=1e-4, rtol=1e-4)
        for i in (1, 2):                                   # the head alone, from the same initial state
            head = state.clone()
            lo = int(cu[i])
            gated_delta_rule_ref(q[lo:lo + cuts[i]], k[lo:lo + cuts[i]], v[lo:lo + cuts[i]], g[lo:lo + cuts[i]],
                                 beta[lo:lo + cuts[i]], head, slots[i:i + 1], torch.tensor([0, cuts[i]]), live[i:i + 1])
            torch.testing.assert_close(s[snap_slots[i]], head[slots[i]], atol=1e-4, rtol=1e-4)
        assert s[free[2]].isnan().all()                    # the unused free slot is untouched


@pytest.mark.parametrize("Hk, Hv, L, dtype", [(2, 2, 1, torch.float32), (1, 3, 1, torch.float16),
                                               (2, 2, 4, torch.float32), (1, 3, 4, torch.float32)])
def test_gdn_decode(Hk, Hv, L, dtype):
    """L=1: plain decode; L=4: L tokens per sequence in one step; against the references. A verify step gives the
    same outputs, leaves both pools as they were and keeps each row's replay inputs."""
    torch.manual_seed(4)
    inp = decode_inputs(3, L, Hk, Hv, 16, 16, dtype, "cpu")
    ref = run_decode(gdn_decode_ref, inp, False)
    tri = run_decode(gdn_decode_triton, inp, False, block_v=8)   # two V blocks: 2 * Hv/Hk programs per qk head
    tol = 1e-4 if dtype == torch.float32 else 5e-3
    torch.testing.assert_close(tri[0], ref[0], atol=tol, rtol=tol)
    check_pool(tri[1], ref[1], inp["slots"], tol)
    check_pool(tri[2], ref[2], inp["slots"], tol)
    assert torch.equal(run_decode(gdn_decode, inp, False)[0], run_decode(gdn_decode_ref, inp, False)[0])
    ref_v = run_decode(gdn_decode_ref, inp, True)
    tri_v = run_decode(gdn_decode_triton, inp, True, block_v=8)
    for v in (ref_v, tri_v):
        torch.testing.assert_close(v[0], ref[0], atol=tol, rtol=tol)
        assert torch.equal(v[1].nan_to_num(), inp["conv_state"].nan_to_num())      # nothing written
        assert torch.equal(v[2].nan_to_num(), inp["ssm_state"].nan_to_num())
    assert_rows_close(tri_v[3], ref_v[3], tol)


def verify_then_replay(decode, replay, NL, B, L, Hk, Hv, K, V, dtype, device, accepted, snap_rows):
    """NL layers of one model state: a verify step of L rows per sequence in every layer, then a replay of
    accepted[i] rows (snapshots after snap_rows[i], -1: none). Returns (layer inputs, slots, pools before, pools
    after, snapshot slots)."""
    layers = [decode_inputs(B, L, Hk, Hv, K, V, dtype, device, has_state=[True] * B, num_slots=2 * B + 1)
              for _ in range(NL)]
    slots = layers[0]["slots"]
    conv = torch.stack([x["conv_state"] for x in layers])     # each layer's live rows moved to the first's slots
    ssm = torch.stack([x["ssm_state"] for x in layers])
    for j, x in enumerate(layers):
        conv[j], ssm[j] = conv[0].clone(), ssm[0].clone()
        conv[j][slots], ssm[j][slots] = x["conv_state"][x["slots"]], x["ssm_state"][x["slots"]]
    free = [i for i in range(2 * B + 1) if i not in slots.tolist()]
    snap_slots = torch.tensor([free[i] if r >= 0 else free[-1] for i, r in enumerate(snap_rows)], device=device)
    for j in range(NL):
        layers[j] = dict(layers[j], slots=slots)
    before = conv.clone(), ssm.clone()
    C = layers[0]["qkv"].shape[1]
    rows = VerifyRows.allocate(NL, B, L, C, Hv, dtype, device)
    for j, x in enumerate(layers):
        decode(**dict(x, conv_state=conv[j], ssm_state=ssm[j]), verify=rows.layer(j))
    assert torch.equal(conv.nan_to_num(), before[0].nan_to_num()) and torch.equal(ssm.nan_to_num(),
                                                                                  before[1].nan_to_num())
    replay(conv, ssm, slots, torch.tensor(accepted, dtype=torch.int32, device=device), rows,
           torch.tensor(snap_rows, dtype=torch.int32, device=device), snap_slots)
    return layers, slots, before, (conv, ssm), snap_slots


def plain_states(layer, slot, conv, ssm, rows: int, B: int, L: int):
    """One sequence's (conv window, state) after its first `rows` rows, by plain decode steps of one token."""
    conv, ssm = conv.clone(), ssm.clone()
    i = layer["slots"].tolist().index(slot)
    for t in range(rows):
        r = slice(i * L + t, i * L + t + 1)
        gdn_decode_ref(layer["qkv"][r], layer["a"][r], layer["b"][r], layer["conv_weight"], conv, layer["A_log"],
                       layer["dt_bias"], ssm, layer["slots"][i:i + 1], torch.tensor([True]))
    return conv[slot], ssm[slot]


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_verify_then_replay_equals_plain_steps(impl):
    """After a verify step of L rows, replaying n of them leaves every layer's conv window and recurrent state as n
    plain one-token steps would (n = 1 .. L); a snapshot inside the accepted run holds the state after its row."""
    torch.manual_seed(7)
    NL, B, L = 2, 3, 4
    accepted, snap_rows = [1, 4, 3], [-1, 1, 0]
    decode = gdn_decode_ref if impl == "ref" else functools.partial(gdn_decode_triton, block_v=8)
    replay = gdn_replay_ref if impl == "ref" else gdn_replay_triton
    layers, slots, (conv0, ssm0), (conv, ssm), snap_slots = verify_then_replay(
        decode, replay, NL, B, L, 1, 3, 16, 16, torch.float32, "cpu", accepted, snap_rows)
    for j, x in enumerate(layers):
        for i, slot in enumerate(slots.tolist()):
            want_conv, want_ssm = plain_states(x, slot, conv0[j], ssm0[j], accepted[i], B, L)
            torch.testing.assert_close(conv[j, slot], want_conv, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(ssm[j, slot], want_ssm, atol=1e-5, rtol=1e-5)
            if snap_rows[i] >= 0:
                snap_conv, snap_ssm = plain_states(x, slot, conv0[j], ssm0[j], snap_rows[i] + 1, B, L)
                torch.testing.assert_close(conv[j, snap_slots[i]], snap_conv, atol=1e-6, rtol=1e-6)
                torch.testing.assert_close(ssm[j, snap_slots[i]], snap_ssm, atol=1e-5, rtol=1e-5)


def with_ba_proj(inp, H):
    """The decode inputs with b and a made from a layer input x [T, H] and a weight [2 Hv, H] (ba_proj)."""
    T, Hv = inp["a"].shape
    x = torch.randn(T, H + 8, dtype=inp["qkv"].dtype, device=inp["qkv"].device)[:, 8:]     # a strided view
    w_ba = (torch.randn(2 * Hv, H, device=x.device) / H ** 0.5).to(x.dtype)
    return dict(inp, a=None, b=None, ba_proj=(x, w_ba))


@pytest.mark.parametrize("Hk, Hv, L, H, dtype", [(2, 2, 1, 48, torch.float32), (1, 3, 4, 1100, torch.float16)])
def test_gdn_decode_projects_b_and_a(Hk, Hv, L, H, dtype):
    """ba_proj: the kernel projects b and a itself (H not a power of two: masked chunks; over 1,024: two chunks)
    and matches the reference given the same x and weight."""
    torch.manual_seed(5)
    inp = with_ba_proj(decode_inputs(2, L, Hk, Hv, 16, 16, dtype, "cpu"), H)
    ref = run_decode(gdn_decode_ref, inp, L > 1)
    tri = run_decode(gdn_decode_triton, inp, L > 1, block_v=8)
    tol = 1e-4 if dtype == torch.float32 else 5e-3
    for i in (1, 2):
        torch.testing.assert_close(tri[i], ref[i], atol=tol, rtol=tol, equal_nan=True)
    torch.testing.assert_close(tri[0], ref[0], atol=tol, rtol=tol)
    if L > 1:
        assert_rows_close(tri[3], ref[3], tol)


def with_norm(inp):
    """A gated norm's inputs for the decode outputs: z [T, Hv, V] as a column slice of a wider projection (strided
    rows, like in_proj's z), a weight of the activation dtype and eps."""
    T, dtype = inp["qkv"].shape[0], inp["qkv"].dtype
    _, Hv, _, V = inp["ssm_state"].shape
    z = torch.randn(T, Hv * V + 24, dtype=dtype, device=inp["qkv"].device)[:, 24:].view(T, Hv, V)
    w = (1 + 0.2 * torch.randn(V, device=z.device)).to(dtype)
    return z, w, 1e-6


def assert_fused_norm(inp, steps, tol, block_v=None):
    """gdn_decode with norm: close to the references, and to the step (same V blocks) followed by the gated norm
    kernel. In the interpreter: the same bits as that, states included. On the GPU the two kernels' sums of squares
    may add in another order; the states are the same bits (with FP fusion on, the compiler contracted the state
    update into other FMAs when the step carried the norm, and they differed in the last bits on the H200)."""
    B = inp["slots"].shape[0]
    block_v = block_v or decode_block_v(B)
    norm = with_norm(inp)
    ref = run_decode(gdn_decode_ref, inp, steps, norm=norm)
    fused = run_decode(gdn_decode_triton, inp, steps, norm=norm, block_v=block_v)
    plain = run_decode(gdn_decode_triton, inp, steps, block_v=block_v)
    unfused = gated_rms_norm_triton(plain[0], *norm)
    if not fused[0].is_cuda:
        torch.testing.assert_close(fused[0], ref[0], atol=tol, rtol=tol)
        assert torch.equal(fused[0], unfused)
        for got, want in zip(fused[1:3], plain[1:3]):
            assert torch.equal(got.nan_to_num(), want.nan_to_num())
        if steps:
            assert_rows_close(fused[3], plain[3], 0)
        return
    slots = inp["slots"]
    assert rel_err(fused[0], ref[0]) < tol
    torch.testing.assert_close(fused[0], unfused, atol=1e-2, rtol=1e-2)
    check_pool(fused[1], ref[1], slots, 0)                 # conv windows are copies of the inputs: exact
    written = slots[inp["has_state"]] if steps else slots  # a verify writes no state: a new sequence's stays poison
    assert rel_err(fused[2][written], ref[2][written]) < 1e-2
    assert torch.equal(fused[2].nan_to_num(), plain[2].nan_to_num())
    assert_untouched(fused[2], slots)
    if steps:
        assert_verify_rows_gpu(fused[3], ref[3])


@pytest.mark.parametrize("B, Hk, Hv, L, dtype", [(2, 2, 2, 1, torch.float32), (1, 1, 3, 1, torch.float16),
                                                  (2, 1, 3, 4, torch.float32), (3, 1, 3, 1, torch.float32),
                                                  (1, 1, 3, 3, torch.float32), (2, 2, 2, 6, torch.float16)])
def test_gdn_decode_fused_norm(B, Hk, Hv, L, dtype):
    """norm: up to FUSED_NORM_MAX_B (2) sequences the step's last programs normalise the outputs (a step's: the last of
    each qk head, its v heads; a verify's: the last of each v head, its rows; two V blocks each here), row by row (1,
    3, 4 and 6 rows); B = 3 takes the norm kernel after the step."""
    torch.manual_seed(6)
    assert_fused_norm(decode_inputs(B, L, Hk, Hv, 16, 16, dtype, "cpu"), L > 1, 1e-4 if dtype == torch.float32
                      else 5e-3, block_v=8)


# ---------------------------------------------------------------- GPU: bf16 at 27B shapes

gpu = pytest.mark.gpu


def assert_verify_rows_gpu(got: VerifyRows, want: VerifyRows):
    """Verify rows of the Triton step against the references' on the GPU: raw rows are copies (exact); q, k, v,
    g and beta close (the kernel keeps the conv outputs in fp32, the references round them to bf16)."""
    torch.testing.assert_close(got.raw, want.raw, atol=0, rtol=0)
    assert rel_err(got.qkv, want.qkv) < 1e-2 and rel_err(got.gb, want.gb) < 1e-3, (rel_err(got.qkv, want.qkv),
                                                                                   rel_err(got.gb, want.gb))


@gpu
@pytest.mark.parametrize("B, L", [(1, 4), (8, 6)])
def test_verify_then_replay_gpu(B, L):
    """The replay at the 27B shapes (48 layers in one launch) against plain steps, with a snapshot inside."""
    torch.manual_seed(17)
    accepted = [1 + (i * 3) % L for i in range(B)]
    snap_rows = [a - 2 if a > 1 else -1 for a in accepted]
    layers, slots, (conv0, ssm0), (conv, ssm), snap_slots = verify_then_replay(
        gdn_decode, gdn_replay, 3, B, L, **SHAPE_27B, dtype=torch.bfloat16, device="cuda", accepted=accepted,
        snap_rows=snap_rows)
    for j, x in enumerate(layers):
        for i, slot in enumerate(slots.tolist()):
            want_conv, want_ssm = plain_states(x, slot, conv0[j], ssm0[j], accepted[i], B, L)
            torch.testing.assert_close(conv[j, slot], want_conv, atol=0, rtol=0)
            assert rel_err(ssm[j, slot], want_ssm) < 1e-2
            if snap_rows[i] >= 0:
                _, snap_ssm = plain_states(x, slot, conv0[j], ssm0[j], snap_rows[i] + 1, B, L)
                assert rel_err(ssm[j, snap_slots[i]], snap_ssm) < 1e-2


@gpu
@pytest.mark.parametrize("B, L", [(1, 4), (1, 8), (1, 16), (2, 6), (8, 6)])
def test_verify_rows_are_plain_steps_bit_for_bit_gpu(B, L):
    """What exact speculation rests on: a verify's row outputs are the bits L plain one-token steps give, at the
    27B shape with b|a projected and the gated norm applied as the int4 model runs them (fused up to two sequences);
    and a replay of its first n rows leaves the states n plain steps leave, bit for bit (n = 1 and L)."""
    torch.manual_seed(18)
    inp = with_ba_proj(decode_inputs(B, L, **SHAPE_27B, dtype=torch.bfloat16, device="cuda", has_state=[True] * B),
                       5120)
    norm = with_norm(inp)
    verify, conv0, ssm0, rows_kept = run_decode(gdn_decode, inp, True, norm=norm)
    x, w_ba = inp["ba_proj"]
    z, w, eps = norm
    slots = inp["slots"]
    conv, ssm = conv0.clone(), ssm0.clone()
    after = {}
    for t in range(L):
        rows = [i * L + t for i in range(B)]
        step = gdn_decode(inp["qkv"][rows], None, None, inp["conv_weight"], conv, inp["A_log"], inp["dt_bias"], ssm,
                          slots, inp["has_state"], ba_proj=(x[rows], w_ba), norm=(z[rows], w, eps))
        assert torch.equal(verify[rows], step), (t, (verify[rows] != step).sum().item())
        after[t + 1] = conv[slots].clone(), ssm[slots].clone()
    for n in (1, L):
        conv_r, ssm_r = conv0.clone()[None], ssm0.clone()[None]
        stacked = VerifyRows(rows_kept.raw[None], rows_kept.qkv[None], rows_kept.gb[None])
        gdn_replay(conv_r, ssm_r, slots, torch.full((B,), n, dtype=torch.int32, device="cuda"), stacked)
        assert torch.equal(conv_r[0][slots], after[n][0]), n
        assert torch.equal(ssm_r[0][slots], after[n][1]), (n, (ssm_r[0][slots] != after[n][1]).sum().item())


@gpu
def test_causal_conv1d_varlen_gpu():
    torch.manual_seed(10)
    lens, C = [1, 63, 64, 1000, 7], 10240
    cu, slots, live = batch_meta(lens, [True, False, True, False, True], 9, "cuda")
    x = projection_rows(sum(lens), C, 48, torch.bfloat16, "cuda")[0]
    weight = 0.5 * torch.randn(C, W, dtype=torch.bfloat16, device="cuda")
    state = poison_pool(torch.randn(9, W - 1, C, dtype=torch.bfloat16, device="cuda"), slots, live)
    s_ref, s_tri = state.clone(), state.clone()
    y_ref = causal_conv1d_ref(x, weight, s_ref, slots, cu, live)
    y_tri = causal_conv1d(x, weight, s_tri, slots, cu, live)
    assert rel_err(y_tri, y_ref) < 1e-2
    check_pool(s_tri, s_ref, slots, 0)


@gpu
@pytest.mark.parametrize("B, L", [(8, 1), (2, 4)])
def test_causal_conv1d_update_gpu(B, L):
    torch.manual_seed(11)
    C = 10240
    _, slots, live = batch_meta([L] * B, [i % 3 != 1 for i in range(B)], B + 3, "cuda")
    x = projection_rows(B * L, C, 48, torch.bfloat16, "cuda")[0]
    weight = 0.5 * torch.randn(C, W, dtype=torch.bfloat16, device="cuda")
    state = poison_pool(torch.randn(B + 3, W - 1, C, dtype=torch.bfloat16, device="cuda"), slots, live)
    s_ref, s_tri = state.clone(), state.clone()
    st_ref, st_tri = (torch.full((B, L, W - 1, C), float("nan"), dtype=torch.bfloat16, device="cuda")
                      for _ in range(2))
    y_ref = causal_conv1d_update_ref(x, weight, s_ref, slots, live, st_ref)
    y_tri = causal_conv1d_update(x, weight, s_tri, slots, live, st_tri)
    assert rel_err(y_tri, y_ref) < 1e-2
    check_pool(s_tri, s_ref, slots, 0)
    torch.testing.assert_close(st_tri, st_ref, atol=0, rtol=0)


@gpu
@pytest.mark.parametrize("B, L, ba_proj", [(1, 1, False), (2, 1, False), (4, 1, False), (8, 1, False), (1, 4, False),
                                           (3, 4, False), (1, 1, True), (8, 1, True), (3, 4, True)])
def test_gdn_decode_gpu(B, L, ba_proj):
    torch.manual_seed(12)
    inp = decode_inputs(B, L, **SHAPE_27B, dtype=torch.bfloat16, device="cuda")
    if ba_proj:
        inp = with_ba_proj(inp, 5120)
    ref = run_decode(gdn_decode_ref, inp, False)
    tri = run_decode(gdn_decode, inp, False)
    slots = inp["slots"]
    assert tri[0].dtype == torch.bfloat16 and rel_err(tri[0], ref[0]) < 2e-2
    assert rel_err(tri[2][slots], ref[2][slots]) < 1e-2
    check_pool(tri[1], ref[1], slots, 0)                 # conv windows are copies of the inputs: exact
    assert_untouched(tri[2], slots)
    if L > 1:
        ref_v, tri_v = run_decode(gdn_decode_ref, inp, True), run_decode(gdn_decode, inp, True)
        assert rel_err(tri_v[0], ref[0]) < 2e-2
        assert_verify_rows_gpu(tri_v[3], ref_v[3])


@gpu
@pytest.mark.parametrize("B, L, block_v", [(1, 1, None), (2, 1, None), (1, 1, 16), (1, 4, None), (8, 1, None),
                                            (3, 4, None)])
def test_gdn_decode_fused_norm_gpu(B, L, block_v):
    """The gated norm at the 27B shapes (with ba_proj, as the int4 model runs it): fused into the step up to
    FUSED_NORM_MAX_B sequences, a kernel of its own above."""
    torch.manual_seed(13)
    inp = with_ba_proj(decode_inputs(B, L, **SHAPE_27B, dtype=torch.bfloat16, device="cuda"), 5120)
    assert_fused_norm(inp, L > 1, 2e-2, block_v=block_v)


@gpu
def test_recurrent_gated_delta_rule_gpu():
    torch.manual_seed(13)
    args, state, slots, cu, live = prefill_inputs([1, 63, 64, 300], [True, False, True, False], **SHAPE_27B,
                                                  dtype=torch.bfloat16, device="cuda")
    s_ref, s_tri = state.clone(), state.clone()
    o_ref = gated_delta_rule_ref(*args, s_ref, slots, cu, live)
    o_tri = recurrent_gated_delta_rule_triton(*args, s_tri, slots, cu, live)
    assert rel_err(o_tri, o_ref) < 2e-2
    assert rel_err(s_tri[slots], s_ref[slots]) < 1e-2
    assert_untouched(s_tri, slots)


@gpu
def test_snapshot_inside_a_prefill_step_gpu():
    torch.manual_seed(14)
    lens, cuts = [300, 5, 120], [256, 0, 64]
    args, state, slots, cu, live = prefill_inputs(lens, [False, True, True], **SHAPE_27B, dtype=torch.bfloat16,
                                                  device="cuda")
    free = [i for i in range(state.shape[0]) if i not in slots.tolist()]
    snap = (torch.tensor(cuts, dtype=torch.int32, device="cuda"), torch.tensor(free[:3], device="cuda"))
    s_ref, s_tri = state.clone(), state.clone()
    o_ref = gated_delta_rule_ref(*args, s_ref, slots, cu, live, *snap)
    o_tri = gated_delta_rule(*args, s_tri, slots, cu, live, *snap)        # <= 512 tokens: the recurrent kernel
    assert rel_err(o_tri, o_ref) < 2e-2
    saved = torch.tensor([free[0], free[2]], device="cuda")
    assert rel_err(s_tri[slots], s_ref[slots]) < 1e-2 and rel_err(s_tri[saved], s_ref[saved]) < 1e-2
    assert s_tri[free[1]].isnan().all()


@gpu
@pytest.mark.parametrize("lens, has_state", [([1], [True]), ([1], [False]), ([63], [True]), ([63], [False]),
                                             ([64], [True]), ([64], [False]), ([1000], [True]), ([1000], [False]),
                                             ([1, 63, 64, 1000], [True, False, False, True])])
def test_gated_delta_rule_prefill_gpu(lens, has_state):
    """The CUDA dispatch (fla when importable, else the Triton recurrent kernel) against the reference."""
    torch.manual_seed(14)
    args, state, slots, cu, live = prefill_inputs(lens, has_state, **SHAPE_27B, dtype=torch.bfloat16, device="cuda")
    s_ref, s_gpu = state.clone(), state.clone()
    o_ref = gated_delta_rule_ref(*args, s_ref, slots, cu, live)
    o_gpu = gated_delta_rule(*args, s_gpu, slots, cu, live)
    assert o_gpu.dtype == torch.bfloat16 and rel_err(o_gpu, o_ref) < 3e-2
    assert rel_err(s_gpu[slots], s_ref[slots]) < 3e-2
    assert_untouched(s_gpu, slots)


@gpu
def test_fla_path_gpu():
    """fla itself (skipped when fla-core is not importable; then the dispatch above ran the Triton fallback)."""
    if _fla_chunk() is None:
        pytest.skip("fla-core not importable")
    torch.manual_seed(15)
    args, state, slots, cu, live = prefill_inputs([1, 63, 64, 1000], [False, True, True, False], **SHAPE_27B,
                                                  dtype=torch.bfloat16, device="cuda")
    s_ref, s_fla = state.clone(), state.clone()
    o_ref = gated_delta_rule_ref(*args, s_ref, slots, cu, live)
    o_fla = gated_delta_rule_fla(*args, s_fla, slots, cu, live)
    assert rel_err(o_fla, o_ref) < 3e-2 and rel_err(s_fla[slots], s_ref[slots]) < 3e-2


@gpu
@pytest.mark.parametrize("B, L", [(4, 1), (1, 4)])
def test_decode_cuda_graph(B, L):
    """gdn_decode and causal_conv1d_update captured in one CUDA graph replay exactly like eager calls."""
    torch.manual_seed(16)
    inp = decode_inputs(B, L, **SHAPE_27B, dtype=torch.bfloat16, device="cuda", has_state=[True] * B)
    conv_x = projection_rows(B * L, 10240, 48, torch.bfloat16, "cuda")[0]
    pools = [inp["conv_state"], inp["ssm_state"]]
    start = [p.clone() for p in pools]
    rows = VerifyRows.allocate(1, B, L, 10240, 48, torch.bfloat16, "cuda").layer(0) if L > 1 else None
    steps = [rows.raw, rows.qkv, rows.gb] if rows is not None else []

    def step():
        o = gdn_decode(**inp, verify=rows)
        return o, causal_conv1d_update(conv_x, inp["conv_weight"], inp["conv_state"], inp["slots"], inp["has_state"])

    def restore():
        for p, s in zip(pools, start):
            p.copy_(s)

    eager = [t.clone() for t in (*step(), *pools, *steps)]
    restore()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()                                           # warm-up (compiles) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    restore()
    graph.replay()
    torch.cuda.synchronize()
    replayed = [*outs, *pools, *steps]
    for got, want in zip(replayed, eager):
        assert torch.equal(got.nan_to_num(), want.nan_to_num())

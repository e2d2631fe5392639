"""The grouped MoE expert kernels (qwendesk_kernels/moe_grouped.py) against their torch references.

CPU: the alignment and the two grouped GEMMs in the interpreter (fp16 / fp32: the interpreter's dot has no bf16),
small shapes that reach every BM of the default configs, K past the last full block, experts without pairs, one
expert taking every pair, P = 8 and 9. GPU (`gpu` mark): the 35B-A3B shape in int4 and bf16, every config the
bench sweeps, and a CUDA graph replayed with other routing.
"""

import pytest
import torch

from qwendesk_kernels import moe_grouped as mg
from qwendesk_kernels.moe_grouped import (default_config, max_blocks, moe_align, moe_align_ref, moe_grouped,
                                 moe_grouped_ref, moe_grouped_triton, warm_up_tokens, workspace_bytes)
from qwendesk_kernels.quant_format import pack_int4

pytestmark = pytest.mark.usefixtures("poisoned_outputs")   # see tests/conftest.py

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def routing(T, P, E, device="cpu", seed=0):
    """ids [T, P] int32 (random, repeats allowed) and positive weights [T, P] fp32."""
    gen = torch.Generator(device).manual_seed(seed)
    ids = torch.randint(0, E, (T, P), generator=gen, device=device, dtype=torch.int32)
    return ids, torch.rand(T, P, generator=gen, device=device) + 0.05


def experts_16bit(E, H, I, dtype, device="cpu", seed=1):
    gen = torch.Generator(device).manual_seed(seed)
    gate_up = torch.randn(2 * I * E, H, generator=gen, device=device) / H ** 0.5
    down = torch.randn(H * E, I, generator=gen, device=device) / I ** 0.5
    return gate_up.to(dtype), down.to(dtype)


def random_int4(N, K, G, dtype, device="cpu", seed=1):
    gen = torch.Generator(device).manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device=device, generator=gen)
    scales = ((0.5 + torch.rand(N, K // G, device=device, generator=gen)) / (4 * K ** 0.5)).to(dtype)
    zeros = (7 + torch.rand(N, K // G, device=device, generator=gen)).to(dtype)
    return pack_int4(q, scales, zeros, G)


def experts_int4(E, H, I, G, dtype, device="cpu"):
    return random_int4(2 * I * E, H, G, dtype, device, 1), random_int4(H * E, I, G, dtype, device, 2)


def check(out, ref, tol):
    """Close to the reference relative to its largest magnitude (the output's rounding scale)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())


# ---------------------------------------------------------------------------------------------------- alignment

@pytest.mark.parametrize("T,P,E,BM", [(1, 9, 5, 16), (9, 8, 40, 16), (40, 9, 5, 32), (130, 8, 40, 64),
                                      (300, 9, 3, 128)])
def test_align_matches_reference(T, P, E, BM, monkeypatch):
    """Pairs sorted by expert in pair order, each run padded to whole blocks with the sentinel T P, the block ->
    expert map and the block count, for experts spread over several programs (ALIGN_EXPERTS) and the pairs over
    several segments (ALIGN_SEGMENT made small)."""
    monkeypatch.setattr(mg, "ALIGN_SEGMENT", 512)
    ids, _ = routing(T, P, E)
    ids[:, 0] = E - 1                                   # the last expert always has pairs; at E = 40 some have none
    pairs, block_expert, num_blocks = moe_align(ids, E, BM)
    ref_pairs, ref_experts, blocks = moe_align_ref(ids, E, BM)
    assert int(num_blocks) == blocks <= max_blocks(T * P, E, BM) == block_expert.numel()
    assert torch.equal(pairs[:blocks * BM], ref_pairs) and torch.equal(block_expert[:blocks], ref_experts)


def test_align_one_expert_takes_every_pair():
    ids = torch.full((70, 9), 6, dtype=torch.int32)
    pairs, block_expert, num_blocks = moe_align(ids, 7, 64)
    assert int(num_blocks) == 10 and block_expert[:10].tolist() == [6] * 10
    assert torch.equal(pairs[:630], torch.arange(630, dtype=torch.int32)) and (pairs[630:640] == 630).all()


# ---------------------------------------------------------------------------------------------------- GEMMs

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("T,P", [(1, 9), (9, 8), (40, 9), (130, 8)])
def test_grouped_16bit(T, P, dtype):
    """16-bit experts: H = 72 and I = 48 leave part of the last K block and of the column tiles past the shape; the
    default configs take BM = 16, 16, 32 and 128 here."""
    E, H, I = 6, 72, 48
    ids, weights = routing(T, P, E, seed=T)
    x = torch.randn(T, H, dtype=dtype)
    gate_up, down = experts_16bit(E, H, I, dtype)
    out = moe_grouped_triton(x, ids, weights, gate_up, down, I)
    check(out, moe_grouped_ref(x, ids, weights, gate_up, down, I), TOL[dtype])


@pytest.mark.parametrize("G,H,I,T,P", [(32, 192, 64, 9, 9), (64, 192, 64, 40, 8), (128, 256, 128, 9, 8)])
def test_grouped_int4(G, H, I, T, P):
    """Int4 experts at each group size; H = 192 and I = 64 end inside a 128-k block (the format's K padding)."""
    E = 4
    ids, weights = routing(T, P, E, seed=G)
    x = torch.randn(T, H, dtype=torch.float16)
    gate_up, down = experts_int4(E, H, I, G, torch.float16)
    config = dict(default_config(T * P, E, True), BN_DOWN=256)      # one column tile of H: fewer interpreted programs
    out = moe_grouped_triton(x, ids, weights, gate_up, down, I, config)
    check(out, moe_grouped_ref(x, ids, weights, gate_up, down, I), TOL[torch.float16])


def test_grouped_int4_fp32_small_block():
    """fp32 activations (exact dots) and BM = 16 with a single token: most blocks hold one pair."""
    E, H, I = 5, 192, 64
    ids, weights = routing(1, 9, E)
    x = torch.randn(1, H)
    gate_up, down = experts_int4(E, H, I, 64, torch.float32)
    out = moe_grouped_triton(x, ids, weights, gate_up, down, I, dict(default_config(9, E, True), BN_DOWN=256))
    check(out, moe_grouped_ref(x, ids, weights, gate_up, down, I), TOL[torch.float32])


@pytest.mark.parametrize("int4", [False, True])
def test_one_expert_takes_every_pair(int4):
    """Every pair on the last expert (its rows start deepest in the stacked weights); the others have none."""
    E, H, I, T, P = 3, 192, 64, 20, 9
    ids = torch.full((T, P), E - 1, dtype=torch.int32)
    weights = torch.rand(T, P)
    x = torch.randn(T, H, dtype=torch.float16)
    gate_up, down = experts_int4(E, H, I, 64, torch.float16) if int4 else experts_16bit(E, H, I, torch.float16)
    out = moe_grouped_triton(x, ids, weights, gate_up, down, I, dict(default_config(T * P, E, int4), BM=64))
    check(out, moe_grouped_ref(x, ids, weights, gate_up, down, I), TOL[torch.float16])


def test_same_bits_every_run():
    E, H, I = 6, 72, 48
    ids, weights = routing(40, 9, E)
    x = torch.randn(40, H, dtype=torch.float16)
    gate_up, down = experts_16bit(E, H, I, torch.float16)
    assert torch.equal(moe_grouped_triton(x, ids, weights, gate_up, down, I),
                       moe_grouped_triton(x, ids, weights, gate_up, down, I))


def test_workspace_bytes_is_what_it_allocates(monkeypatch):
    """workspace_bytes (what the memory plan counts) is every buffer moe_grouped_triton allocates, and the largest
    BM bounds the others."""
    allocated = []
    empty = torch.empty

    def counting_empty(*size, **kw):
        t = empty(*size, **kw)
        allocated.append(t.numel() * t.element_size())
        return t

    monkeypatch.setattr(torch, "empty", counting_empty)
    E, H, I, T, P = 6, 72, 48, 40, 9
    ids, weights = routing(T, P, E)
    x = torch.randn(T, H, dtype=torch.float16)
    moe_grouped_triton(x, ids, weights, *experts_16bit(E, H, I, torch.float16), I)
    BM = default_config(T * P, E, False)["BM"]
    assert sum(allocated) == workspace_bytes(T, P, E, H, I, 2, BM)
    assert all(workspace_bytes(T, P, E, H, I, 2, bm) <= workspace_bytes(T, P, E, H, I, 2) for bm in (16, 32, 64))


def test_warm_up_tokens_reach_every_block_size():
    P, E = 9, 257
    tokens = warm_up_tokens(P, E, 16384)
    assert [default_config(t * P, E, True)["BM"] for t in tokens] == [16, 32, 64, 128]
    assert warm_up_tokens(P, E, 2048) == tokens[:3]


# ---------------------------------------------------------------------------------------------------- GPU

SHAPE = dict(E=257, H=2048, I=512, P=9)      # 35B-A3B: 256 routed experts + the shared one as expert 256


def real_routing(T, device="cuda", seed=0):
    """8 distinct routed experts per token (the router's top-k) and the shared expert last, as the model routes."""
    gen = torch.Generator(device).manual_seed(seed)
    routed = torch.rand(T, SHAPE["E"] - 1, generator=gen, device=device).topk(SHAPE["P"] - 1, dim=1).indices
    ids = torch.cat([routed, torch.full((T, 1), SHAPE["E"] - 1, device=device)], dim=1).to(torch.int32)
    weights = torch.rand(T, SHAPE["P"], generator=gen, device=device)
    return ids, weights / weights[:, :-1].sum(1, keepdim=True)


@pytest.fixture(scope="module")
def real_experts():
    """real_experts(int4) -> (gate_up, down) at the 35B-A3B shape, bf16 or int4 G = 128 (built once)."""
    built = {}

    def get(int4: bool):
        if int4 not in built:
            E, H, I = SHAPE["E"], SHAPE["H"], SHAPE["I"]
            built[int4] = (experts_int4(E, H, I, 128, torch.bfloat16, "cuda") if int4
                           else experts_16bit(E, H, I, torch.bfloat16, "cuda"))
        return built[int4]

    return get


@pytest.mark.gpu
@pytest.mark.parametrize("int4", [False, True], ids=["bf16", "int4"])
@pytest.mark.parametrize("T", [16, 512, 8192])
def test_gpu_real_shape(T, int4, real_experts):
    gate_up, down = real_experts(int4)
    ids, weights = real_routing(T)
    x = torch.randn(T, SHAPE["H"], device="cuda", dtype=torch.bfloat16)
    out = moe_grouped_triton(x, ids, weights, gate_up, down, SHAPE["I"])
    check(out, moe_grouped_ref(x, ids, weights, gate_up, down, SHAPE["I"]), TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("int4", [False, True], ids=["bf16", "int4"])
def test_gpu_every_swept_config(int4, real_experts):
    """Whatever config the bench's sweep finds best must be right."""
    from qwendesk_kernels.bench_moe_grouped import sweep_configs
    gate_up, down = real_experts(int4)
    ids, weights = real_routing(512, seed=3)
    x = torch.randn(512, SHAPE["H"], device="cuda", dtype=torch.bfloat16)
    ref = moe_grouped_ref(x, ids, weights, gate_up, down, SHAPE["I"])
    for config in sweep_configs(int4):
        check(moe_grouped_triton(x, ids, weights, gate_up, down, SHAPE["I"], config), ref, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("int4", [False, True], ids=["bf16", "int4"])
@pytest.mark.parametrize("T", [12, 600])
def test_gpu_graph_replay_other_routing(T, int4, real_experts):
    """Captured once, replayed with other experts per token (so another block count): the eager result, bit for
    bit."""
    gate_up, down = real_experts(int4)
    I = SHAPE["I"]
    ids, weights = real_routing(T, seed=5)
    x = torch.randn(T, SHAPE["H"], device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe_grouped(x, ids, weights, gate_up, down, I)                 # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_grouped(x, ids, weights, gate_up, down, I)
    for seed in (6, 7):
        new_ids, new_weights = real_routing(T, seed=seed)
        if seed == 7:
            new_ids[:, :-1] = new_ids[:1, :-1]                        # every token on the same 8 experts
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, moe_grouped(x, ids, weights, gate_up, down, I))

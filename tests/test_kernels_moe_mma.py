"""The int4 MoE decode kernels on the mma GEMV (qwendesk_kernels/moe_decode_mma.py) against moe_decode_ref.

CPU: the interpreter (mma.sync written out in tl ops), fp16 (the interpreter casts fp32 to bf16 by truncation, and h
is rounded three times), small odd shapes with few units (each costs ~1 s there): K past a whole 128-k block, groups
of 64 / 128, with and without the shared expert's pair, slots per pair and grouped by expert (tokens sharing
experts), row groups split over programs, runs crossing slots, whole row groups; the plan kernel's slots. GPU (`gpu`
mark): bf16 at the 35B-A3B shape, forced configs (the bench's sweep), determinism and CUDA-graph replay.
"""

import pytest
import torch

from qwendesk_kernels.moe_decode import moe_decode_ref
from qwendesk_kernels.bench_moe import MMA_SWEEP
from qwendesk_kernels.moe_decode_mma import MOE_MMA_CONFIG, _plan_kernel, moe_decode_mma, moe_mma_grids
from qwendesk_kernels.splitk import splitk_scratch
from tests.test_kernels_moe import A3B, TOL, a3b, check, experts, rel_err, routed

pytestmark = pytest.mark.usefixtures("poisoned_outputs")   # see tests/conftest.py


@pytest.mark.parametrize("G,H,I,T,k,shared,config", [
    (64, 320, 64, 1, 1, True, dict(PROGRAMS=6, GATE_UP_NW=2)),  # K = 320, 64: padded blocks; gate_up's runs of 2 of
    # 3 blocks: partial sums by pair, runs crossing into the next tile
    (64, 128, 64, 3, 2, True, dict(PROGRAMS=3, DOWN_NW=2)),     # grouped (tokens share experts); down's runs of 3 of
    # a row group's 4 slots: partial sums, runs crossing row groups
    (64, 64, 64, 2, 1, True, dict(PROGRAMS=6, GROUP_MIN_T=99, DOWN_R=1)),   # a slot per pair at T = 2, split
    (128, 128, 128, 1, 2, False, dict(PROGRAMS=1)),             # P = k; whole row groups, no partial sums
])
def test_moe_decode_mma(G, H, I, T, k, shared, config):
    E, dtype = 4, torch.float16
    gate_up, down = experts(E + shared, H, I, "int4", dtype, G)
    x, ids, weights = routed(T, E, k, shared, H, dtype, seed=T)
    check(moe_decode_mma(x, ids, weights, gate_up, down, I, config), moe_decode_ref(x, ids, weights, gate_up, down, I),
          TOL[dtype])
    assert not splitk_scratch(x.device)[1].any()                    # every counter is 0 again


def test_moe_decode_mma_eight_tokens_on_the_same_experts():
    """Grouped: two slots (a routed expert and the shared one), each serving all 8 tokens as the mma's 8 columns."""
    gate_up, down = experts(4, 64, 64, "int4", torch.float16)
    x, ids, weights = routed(8, 3, 1, True, 64, torch.float16, seed=3, same_experts=True)
    check(moe_decode_mma(x, ids, weights, gate_up, down, 64, dict(PROGRAMS=3)),
          moe_decode_ref(x, ids, weights, gate_up, down, 64), TOL[torch.float16])
    assert not splitk_scratch(x.device)[1].any()


def test_moe_decode_mma_a_token_overflowing_stays_its_own():
    """Grouped, one token's h overflows (fp16 inf): a slot without the other token reads that h as its B column, and
    the other token's output is still its result alone."""
    gate_up, down = experts(4, 64, 64, "int4", torch.float16)
    x, ids, weights = routed(2, 3, 1, True, 64, torch.float16, seed=4)
    x[0] *= 1e4
    assert ids[0, 0] != ids[1, 0]                                   # the first slot serves token 0 only
    out = moe_decode_mma(x, ids, weights, gate_up, down, 64, dict(PROGRAMS=2))
    assert not torch.isfinite(out[0]).all()
    check(out[1:], moe_decode_ref(x[1:], ids[1:], weights[1:], gate_up, down, 64), TOL[torch.float16])


def plan_ref(ids: torch.Tensor) -> tuple[list, list]:
    """(each slot's expert in order of first use, each slot's pair per token column, T P for none)."""
    T, P = ids.shape
    flat = ids.flatten().tolist()
    slots = list(dict.fromkeys(flat))
    pairs = [[T * P] * 8 for _ in slots]
    for p, e in enumerate(flat):
        pairs[slots.index(e)][p // P] = p
    return slots, pairs


@pytest.mark.parametrize("T,P,E", [(1, 9, 257), (5, 3, 6), (8, 9, 12), (8, 9, 257)])
def test_plan(T, P, E):
    gen = torch.Generator().manual_seed(T * P)
    ids = torch.stack([torch.randperm(E, generator=gen)[:P] for _ in range(T)]).int()      # distinct per token
    plan = torch.empty(1 + 9 * T * P, dtype=torch.int32)
    _plan_kernel[(1,)](ids, plan, T, P, NP=max(16, 1 << (T * P - 1).bit_length()), PDL=False)
    slots, pairs = plan_ref(ids)
    n = plan[0].item()
    assert n == len(slots) and plan[1:1 + n].tolist() == slots
    assert plan[1 + T * P:].view(T * P, 8)[:n].tolist() == pairs


@pytest.mark.parametrize("config", [{}] + MMA_SWEEP)
def test_grids_at_35b_a3b(config):
    """Every config of the bench at T = 1..8 (P = 9 on 132 SMs): the partial sums fit the split-K scratch (asserted
    inside) and the grid is one wave of at most PER_SM programs per SM (fewer where there are fewer units)."""
    cfg = {**MOE_MMA_CONFIG, **config}
    grids = [moe_mma_grids(T, A3B["k"] + 1, A3B["H"], A3B["I"], config, 132) for T in range(1, 9)]
    assert all(gu <= cfg["GATE_UP_PER_SM"] * 132 and dn <= cfg["DOWN_PER_SM"] * 132 for gu, dn in grids)
    assert grids == sorted(grids)


# ---------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 4, 8])
def test_moe_decode_mma_35b_a3b_gpu(T):
    gate_up, down = a3b("int4")
    x, ids, weights = routed(T, A3B["E"], A3B["k"], True, A3B["H"], torch.bfloat16, "cuda", seed=T)
    out = moe_decode_mma(x, ids, weights, gate_up, down, A3B["I"])
    ref = moe_decode_ref(x, ids, weights, gate_up, down, A3B["I"])
    assert rel_err(out, ref) < 5e-3
    check(out, ref, TOL[torch.bfloat16])
    assert torch.equal(out, moe_decode_mma(x, ids, weights, gate_up, down, A3B["I"]))     # deterministic
    assert not splitk_scratch(x.device)[1].any()


@pytest.mark.gpu
@pytest.mark.parametrize("config", [
    dict(GROUP_MIN_T=99), dict(GROUP_MIN_T=1), dict(DOWN_R=1), dict(GATE_UP_NW=2, DOWN_NW=2),
    dict(GATE_UP_PER_SM=4, DOWN_PER_SM=4), dict(GATE_UP_PER_SM=32, DOWN_PER_SM=32), dict(MAXNREG=None, UNROLL=1),
])
def test_moe_decode_mma_forced_configs_gpu(config):
    """Every config the bench may try computes the same experts (T = 1 and 8, tokens sharing experts at 8)."""
    gate_up, down = a3b("int4")
    for T, same in ((1, False), (8, False), (8, True)):
        x, ids, weights = routed(T, A3B["E"], A3B["k"], True, A3B["H"], torch.bfloat16, "cuda", seed=T,
                                 same_experts=same)
        ref = moe_decode_ref(x, ids, weights, gate_up, down, A3B["I"])
        assert rel_err(moe_decode_mma(x, ids, weights, gate_up, down, A3B["I"], config), ref) < 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
def test_moe_decode_mma_in_a_cuda_graph_gpu(T):
    """Captured once and replayed on new inputs (other experts, another slot count): the eager result on those."""
    gate_up, down = a3b("int4")
    x, ids, weights = routed(T, A3B["E"], A3B["k"], True, A3B["H"], torch.bfloat16, "cuda", seed=T)
    moe_decode_mma(x, ids, weights, gate_up, down, A3B["I"])                 # built before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_decode_mma(x, ids, weights, gate_up, down, A3B["I"])
    x2, ids2, weights2 = routed(T, A3B["E"], A3B["k"], True, A3B["H"], torch.bfloat16, "cuda", seed=T + 100,
                                same_experts=T > 1)
    for dst, src in ((x, x2), (ids, ids2), (weights, weights2)):
        dst.copy_(src)
    graph.replay()
    assert torch.equal(out, moe_decode_mma(x, ids, weights, gate_up, down, A3B["I"]))

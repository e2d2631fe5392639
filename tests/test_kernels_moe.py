"""The MoE routing and decode kernels against their torch references, and the dispatch of
qwendesk_kernels/ops.moe_experts.

CPU: the Triton kernels run in the interpreter (fp32 / fp16, small odd shapes: K past a whole 128-k block, groups
of 32 / 64 / 128, 16-bit and int4 weights, with and without the shared expert's pair, split and unsplit). GPU
(`gpu` mark): bf16 at the 35B-A3B shape (H 2048, I 512, 256 experts + the shared one, top 8), forced configs, and
replay from a CUDA graph.
"""

import pytest
import torch

from qwendesk_kernels import ops
from qwendesk_kernels.moe_decode import MOE_DECODE_MAX_T, moe_decode, moe_decode_ref
from qwendesk_kernels.moe_route import moe_route, moe_route_ref, moe_route_triton
from qwendesk_kernels.moe_grouped import moe_grouped_ref
from qwendesk_kernels.moe_sorted import moe_sorted
from qwendesk_kernels.quant_format import dequantize_int8_ref, pack_int4, pack_int8
from qwendesk_kernels.splitk import splitk_scratch

pytestmark = pytest.mark.usefixtures("poisoned_outputs")   # see tests/conftest.py

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
BIG = dict(GATE_UP_BN=64, DOWN_BN=64)          # few programs: the interpreter runs them one by one
UNSPLIT = dict(BIG, GATE_UP_PER=99, DOWN_PER=99)


def check(out, ref, tol):
    """Close to the reference relative to its largest magnitude (the output's rounding scale)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())


def random_int4(N, K, G, dtype, device="cpu", seed=0):
    gen = torch.Generator(device).manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device=device, generator=gen)
    scales = (0.002 + 0.01 * torch.rand(N, K // G, device=device, generator=gen)).to(dtype)
    return pack_int4(q, scales, (15 * torch.rand(N, K // G, device=device, generator=gen)).to(dtype), G)


def experts(E, H, I, kind, dtype, G=64, device="cpu", seed=0):
    """(gate_up, down) of E stacked experts: "int4", "16bit", or "mixed" (int4 gate_up, 16-bit down)."""
    def weight(N, K, int4, seed):
        if int4:
            return random_int4(N, K, G, dtype, device, seed)
        gen = torch.Generator(device).manual_seed(seed)
        return (torch.randn(N, K, device=device, generator=gen) / K ** 0.5).to(dtype)

    return weight(E * 2 * I, H, kind != "16bit", seed), weight(E * H, I, kind == "int4", seed + 1)


def routed(T, E, k, shared, H, dtype, device="cpu", seed=0, same_experts=False):
    """x [T, H] and its pairs (ids, weights) from random router logits; same_experts: every token routed alike."""
    gen = torch.Generator(device).manual_seed(seed)
    logits = torch.randn(T, E + shared, device=device, generator=gen)
    if same_experts:
        logits[:] = logits[0]
    ids, weights = moe_route_ref(logits.to(dtype), k, shared)
    return torch.randn(T, H, device=device, generator=gen).to(dtype), ids, weights


# ---------------------------------------------------------------------------------------------------- routing

@pytest.mark.parametrize("T,E,k,shared,dtype", [
    (1, 8, 2, True, torch.float32), (5, 6, 3, False, torch.float32), (8, 33, 8, True, torch.float16),
    (20, 256, 8, True, torch.float16), (3, 5, 5, False, torch.float32)])
def test_route(T, E, k, shared, dtype):
    """Ids equal (ties included: half the logits repeat another's exactly), weights as the reference rounds them."""
    gen = torch.Generator().manual_seed(T + E)
    logits = torch.randn(T, E + shared, generator=gen)
    logits[:, 1:E:2] = logits[:, 0:E - 1:2]                   # exact ties between experts 2e and 2e + 1
    logits = logits.to(dtype)
    ids, weights = moe_route_triton(logits, k, shared)
    ref_ids, ref_weights = moe_route_ref(logits, k, shared)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == (T, k + shared)
    assert torch.equal(ids, ref_ids)
    check(weights, ref_weights, TOL[dtype])


def test_route_ties_go_to_the_lower_id_and_cpu_is_the_reference():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, -1.0, 0.3], [3.0, 3.0, 3.0, 0.0, 0.0, 0.0, -1.0]])
    ids, weights = moe_route_triton(logits, 3, shared=True)
    assert ids.tolist() == [[1, 3, 2, 6], [0, 1, 2, 6]]
    assert torch.equal(moe_route(logits, 3, shared=True)[0], ids)
    assert torch.allclose(weights[:, 3], torch.sigmoid(logits[:, 6]))


# ---------------------------------------------------------------------------------------------------- decode

@pytest.mark.parametrize("kind,G,H,I,T,k,shared,dtype,config", [
    ("int4", 64, 192, 64, 1, 2, True, torch.float32, BIG),           # K = 192, 64: padded half blocks; split runs
    ("int4", 32, 192, 64, 2, 2, False, torch.float32, UNSPLIT),      # P = k
    ("int4", 128, 256, 128, 1, 2, True, torch.float16, dict(BIG, GATE_UP_PER=1, DOWN_PER=1)),   # one unit each
    ("16bit", 64, 160, 48, 2, 2, True, torch.float32, BIG),          # K = 160, I = 48: masked k and rows
    ("16bit", 64, 128, 32, 2, 3, False, torch.float16, dict(GATE_UP_BN=16, DOWN_BN=32)),
    ("mixed", 32, 128, 16, 2, 1, True, torch.float32, BIG),          # int4 gate_up, 16-bit down of K = 16
])
def test_moe_decode(kind, G, H, I, T, k, shared, dtype, config):
    E = 5
    gate_up, down = experts(E + shared, H, I, kind, dtype, G)
    x, ids, weights = routed(T, E, k, shared, H, dtype, seed=T)
    check(moe_decode(x, ids, weights, gate_up, down, I, config), moe_decode_ref(x, ids, weights, gate_up, down, I),
          TOL[dtype])
    assert not splitk_scratch(x.device)[1].any()                    # the split counters are 0 again


def test_moe_decode_eight_tokens_on_the_same_experts():
    """Eight tokens, each pair's expert read by every token (left to L2 on a GPU), fp16; the next launch too."""
    gate_up, down = experts(4, 128, 64, "int4", torch.float16)
    x, ids, weights = routed(8, 3, 1, True, 128, torch.float16, seed=3, same_experts=True)
    assert (ids == ids[0]).all()
    ref = moe_decode_ref(x, ids, weights, gate_up, down, 64)
    for _ in range(2):
        check(moe_decode(x, ids, weights, gate_up, down, 64, dict(BIG, DOWN_PER=1)), ref, TOL[torch.float16])


@pytest.mark.parametrize("kind", ["int4", "16bit"])
def test_the_references_agree(kind):
    """The decode kernels' reference (pair by pair) and the sorted torch loop compute the same experts."""
    gate_up, down = experts(7, 128, 64, kind, torch.float32)
    x, ids, weights = routed(6, 6, 2, True, 128, torch.float32)
    check(moe_sorted(x, ids, weights, gate_up, down, 64), moe_decode_ref(x, ids, weights, gate_up, down, 64),
          TOL[torch.float32])


def test_moe_experts_dispatch_on_the_cpu():
    """Up to MOE_DECODE_MAX_T tokens the decode kernels' reference, above it the grouped kernels' reference; int8
    experts: the sorted loop at any T (its weights dequantised give the same experts)."""
    gate_up, down = experts(5, 128, 64, "int4", torch.float32)
    x, ids, weights = routed(MOE_DECODE_MAX_T + 1, 4, 2, True, 128, torch.float32)
    n = MOE_DECODE_MAX_T
    assert torch.equal(ops.moe_experts(x[:n], ids[:n], weights[:n], gate_up, down, 64),
                       moe_decode_ref(x[:n], ids[:n], weights[:n], gate_up, down, 64))
    assert torch.equal(ops.moe_experts(x, ids, weights, gate_up, down, 64),
                       moe_grouped_ref(x, ids, weights, gate_up, down, 64))
    q8 = [pack_int8(torch.randint(-128, 128, w.shape, dtype=torch.int8),
                    0.001 * torch.rand(w.shape[0], w.shape[1] // 64), 64)
          for w in experts(5, 128, 64, "16bit", torch.float32)]
    check(ops.moe_experts(x[:1], ids[:1], weights[:1], *q8, 64),
          moe_decode_ref(x[:1], ids[:1], weights[:1], *[dequantize_int8_ref(w) for w in q8], 64), TOL[torch.float32])


# ---------------------------------------------------------------------------------------------------- GPU

A3B = dict(E=256, k=8, H=2048, I=512)        # the 35B-A3B's MoE layer; the shared expert stacked as expert 256
_gpu = {}


def a3b(kind):
    if kind not in _gpu:
        _gpu[kind] = experts(A3B["E"] + 1, A3B["H"], A3B["I"], kind, torch.bfloat16, 128, "cuda")
    return _gpu[kind]


def rel_err(out, ref):
    assert torch.isfinite(out).all()
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 8, 300])
def test_route_gpu(T):
    gen = torch.Generator("cuda").manual_seed(T)
    logits = torch.randn(T, A3B["E"] + 1, device="cuda", generator=gen).bfloat16()
    ids, weights = moe_route(logits, A3B["k"], shared=True)
    ref_ids, ref_weights = moe_route_ref(logits, A3B["k"], shared=True)
    assert torch.equal(ids, ref_ids)
    check(weights, ref_weights, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int4", "16bit"])
@pytest.mark.parametrize("T", [1, 2, 8])
def test_moe_decode_35b_a3b_gpu(kind, T):
    gate_up, down = a3b(kind)
    x, ids, weights = routed(T, A3B["E"], A3B["k"], True, A3B["H"], torch.bfloat16, "cuda", seed=T)
    out, ref = moe_decode(x, ids, weights, gate_up, down, A3B["I"]), moe_decode_ref(x, ids, weights, gate_up, down,
                                                                                     A3B["I"])
    assert rel_err(out, ref) < 5e-3
    check(out, ref, TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int4", "16bit"])
@pytest.mark.parametrize("config", [
    dict(GATE_UP_BN=16, GATE_UP_WARPS=1, DOWN_BN=16, DOWN_WARPS=1, GATE_UP_PER=16, DOWN_PER=9),   # unsplit
    dict(GATE_UP_BN=32, GATE_UP_WARPS=2, DOWN_BN=32, DOWN_WARPS=2, GATE_UP_PER=1, DOWN_PER=1),    # split to units
    dict(GATE_UP_BN=64, GATE_UP_WARPS=4, DOWN_BN=64, DOWN_WARPS=4, GATE_UP_PER=3, DOWN_PER=4),    # ragged runs
])
def test_moe_decode_forced_configs_gpu(kind, config):
    """Every config the bench may try computes the same thing (T = 1 and 8)."""
    gate_up, down = a3b(kind)
    for T in (1, 8):
        x, ids, weights = routed(T, A3B["E"], A3B["k"], True, A3B["H"], torch.bfloat16, "cuda", seed=T)
        ref = moe_decode_ref(x, ids, weights, gate_up, down, A3B["I"])
        assert rel_err(moe_decode(x, ids, weights, gate_up, down, A3B["I"], config), ref) < 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, MOE_DECODE_MAX_T, 16])
def test_moe_experts_in_a_cuda_graph_gpu(T):
    """Routing + experts captured once (T = 16: above MOE_DECODE_MAX_T, the grouped kernels) and replayed on new
    inputs: the eager result on those inputs."""
    gate_up, down = a3b("int4")
    gen = torch.Generator("cuda").manual_seed(T)
    logits = torch.randn(T, A3B["E"] + 1, device="cuda", generator=gen).bfloat16()
    x = torch.randn(T, A3B["H"], device="cuda", generator=gen).bfloat16()

    def step():
        ids, weights = ops.moe_route(logits, A3B["k"], shared=True)
        return ops.moe_experts(x, ids, weights, gate_up, down, A3B["I"])

    step()                                                                    # built before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    logits.copy_(torch.randn(logits.shape, device="cuda", generator=gen))
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
    graph.replay()
    assert torch.equal(out, step())

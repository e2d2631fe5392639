"""The qwen3_5_moe models (35B-A3B family) on tiny random checkpoints: the sparse MoE block against a naive loop
(the shared expert on its own, and stacked with the routed ones as expert E), the whole model against transformers'
Qwen3_5MoeForCausalLM (fp32, CPU; "moe" has a shared expert of its own, "moe_wrapper_ties" one stacked as expert E),
greedy through the engine, batched equal to alone, int4 experts against their 16-bit selves, the planner's weight
bytes; on a GPU, decode in CUDA graphs against eager decode."""

import pytest
import torch
from transformers import Qwen3_5MoeForCausalLM

from engine.api import Engine, EngineConfig, SamplingParams
from engine.model.config import parse_model_config
from engine.model.linear import Build
from engine.model.moe import SparseMoE
from engine.model.layers import MLP
from engine.weights.loader import load_state_dict
from engine.weights.policy import QuantPolicy, policy_bytes
from qwendesk_kernels.moe_route import moe_route_ref
from tests.fixtures.hf_pairs import HFPairs, rel_err

NAMES = ["moe", "moe_wrapper_ties"]
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(checkpoint):
    pairs = HFPairs(checkpoint, Qwen3_5MoeForCausalLM)
    yield pairs
    pairs.close()


def test_route_softmax_topk_renormalised_ties_to_lower_id():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, -1.0, 0.5],
                           [3.0, 3.0, 3.0, 0.0, 0.0, 0.0, -2.0]])
    ids, weights = moe_route_ref(logits[:, :6], 3, shared=False)
    assert ids.tolist() == [[1, 3, 2], [0, 1, 2]] and ids.dtype == torch.int32 and weights.dtype == torch.float32
    probs = torch.softmax(logits[:, :6], -1)
    ref = probs.gather(1, ids.long())
    assert torch.allclose(weights, ref / ref.sum(-1, keepdim=True))
    assert torch.allclose(weights.sum(-1), torch.ones(2))
    with_shared, shared_weights = moe_route_ref(logits, 3, shared=True)     # the last logit: the shared expert's gate
    assert with_shared.tolist() == [[1, 3, 2, 6], [0, 1, 2, 6]]
    assert torch.equal(shared_weights[:, :3], weights)
    assert torch.allclose(shared_weights[:, 3], torch.sigmoid(logits[:, 6]))


def tiny_moe(policy=None, seed=0, E=8, k=3, I=32, H=64, S=48):
    """S: the shared expert's width (S = I: stacked with the routed experts as expert E)."""
    raw = {"model_type": "qwen3_5_moe_text", "vocab_size": 16, "hidden_size": H, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "num_experts": E,
           "num_experts_per_tok": k, "moe_intermediate_size": I, "shared_expert_intermediate_size": S}
    cfg = parse_model_config(raw)
    build = Build(torch.float32, "cpu", policy)
    shared = None if S == I else MLP(cfg, build, "layers.0.mlp.shared_expert.", S)
    moe = SparseMoE(cfg, build, "layers.0.mlp.", shared)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return moe


def naive(moe, x):
    """Token by token, expert by expert, from the module's own weights: softmax over the E routed experts, top k
    by a stable sort, renormalised; the shared expert (expert E of the stacked weights, its gate the router's row E,
    when it is stacked) times sigmoid of its gate."""
    E, I, H = moe.num_experts, moe.inter, moe.hidden
    w_router, gate_up, down = moe.router.dequantized(), moe.gate_up.dequantized(), moe.down.dequantized()

    def expert(e, x):
        g, u = (gate_up[2 * I * e:2 * I * (e + 1)] @ x).chunk(2)
        return down[H * e:H * (e + 1)] @ (torch.nn.functional.silu(g) * u)

    out = []
    for t in range(x.shape[0]):
        probs = torch.softmax(w_router[:E] @ x[t], -1)
        top, ids = torch.sort(probs, descending=True, stable=True)
        top, ids = top[:moe.top_k] / top[:moe.top_k].sum(), ids[:moe.top_k]
        y = sum(w * expert(e, x[t]) for w, e in zip(top, ids.tolist()))
        if moe.shared_expert is None:
            y = y + torch.sigmoid(w_router[E] @ x[t]) * expert(E, x[t])
        else:
            y = y + torch.sigmoid(moe.shared_gate.dequantized()[0] @ x[t]) * moe.shared_expert(x[t:t + 1])[0]
        out.append(y)
    return torch.stack(out)


def route(moe, x):
    """The routed experts' ids [T, k] (the shared pair left out)."""
    return moe_route_ref(moe.router(x), moe.top_k, shared=moe.shared_expert is None)[0][:, :moe.top_k]


@pytest.mark.parametrize("S", [48, 32])
def test_sparse_moe_equals_a_naive_per_token_loop(S):
    """Prefill (37 tokens: the sorted torch loop) and decode steps (1 and 8 tokens: the decode kernels' reference),
    with the shared expert on its own (S = 48) and stacked as expert E (S = I = 32)."""
    moe = tiny_moe(S=S)
    assert (moe.shared_expert is None) == (S == 32) and moe.gate_up.shape[0] == 2 * 32 * (8 + (S == 32))
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(1))
    assert rel_err(moe(x), naive(moe, x)) < 1e-5
    assert len(set(route(moe, x).flatten().tolist())) == moe.num_experts      # every expert has tokens here
    for n in (1, 8):
        assert rel_err(moe(x[:n]), naive(moe, x[:n])) < 1e-5


@pytest.mark.parametrize("S", [48, 64])
def test_int4_experts_are_their_dequantized_weights(S):
    """int4 experts (each quantized on its own into its rows of the stacked weights, the shared expert too when
    stacked) compute what the naive loop computes from the dequantized weights, at prefill and decode."""
    policy = QuantPolicy(group_size=32)
    moe = tiny_moe(policy, I=64, H=64, S=S)
    assert moe.gate_up.scheme == "int4" and moe.down.scheme == "int4" and moe.router.scheme == "float"
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for lin in (moe.gate_up, moe.down) + ((moe.shared_expert.gate_up,) if moe.shared_expert else ()):
            lin.qweight.copy_(torch.randint(-2**31, 2**31 - 1, lin.qweight.shape, generator=gen, dtype=torch.int32))
            lin.scales.uniform_(0.01, 0.02, generator=gen)
            lin.zeros.uniform_(7, 9, generator=gen)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(3))
    assert rel_err(moe(x), naive(moe, x)) < 1e-4
    assert rel_err(moe(x[:3]), naive(moe, x[:3])) < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_score_matches_transformers(pair, name):
    eng, hf, _ = pair(name)
    ids = torch.randint(0, eng.model_config.vocab_size, (77,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    assert rel_err(eng.score(ids.tolist()), ref) < 1e-4


def test_ties_route_both_halves_of_a_tied_pair(pair):
    """moe_wrapper_ties: router rows 2e and 2e + 1 are equal, so every token's probabilities come in exact pairs
    and with k = 3 the third choice is always one half of a tied pair: the lower id."""
    eng, _, _ = pair("moe_wrapper_ties")
    moe = eng._model.layers[0].mlp
    assert moe.shared_expert is None                    # stacked as expert E: routing gives it the last pair
    x = torch.randn(50, eng.model_config.hidden_size, generator=torch.Generator().manual_seed(5))
    ids, weights = moe_route_ref(moe.router(x), moe.top_k, shared=True)
    assert (ids[:, 0] // 2 == ids[:, 1] // 2).all() and (ids[:, 2] % 2 == 0).all() and (ids[:, 3] == 6).all()
    assert torch.equal(weights[:, 0], weights[:, 1])


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generate_matches_transformers(pair, name):
    eng, hf, _ = pair(name)
    ids = torch.randint(0, eng.model_config.vocab_size, (19,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf.generate(ids[None], attention_mask=torch.ones(1, 19, dtype=torch.long), max_new_tokens=24,
                          do_sample=False)[0, 19:].tolist()
    assert eng.generate(ids.tolist(), SamplingParams(max_tokens=24, **GREEDY)).token_ids == ref


def test_batched_equals_alone_with_different_experts(pair):
    """C2: two sequences decoding together (their tokens routed to different experts in the same steps) each
    equal their run alone."""
    eng, _, path = pair("moe")
    prompts = [torch.randint(0, eng.model_config.vocab_size, (n,), generator=torch.Generator().manual_seed(10 + n))
               .tolist() for n in (23, 41)]
    moe = eng._model.layers[0].mlp
    x = eng._model.embed_tokens(torch.tensor([p[-1] for p in prompts]))
    ids = route(moe, x)
    assert set(ids[0].tolist()) != set(ids[1].tolist())     # different experts for the two (layer 0, last token)
    pair_eng = Engine(EngineConfig(model=str(path), device="cpu", dtype="float32", profile="C2"))
    try:
        handles = [pair_eng.submit(p, SamplingParams(max_tokens=12, **GREEDY)) for p in prompts]
        batched = [[t for ev in h for t in ev.token_ids] for h in handles]
    finally:
        pair_eng.close()
    assert batched == [eng.generate(p, SamplingParams(max_tokens=12, **GREEDY)).token_ids for p in prompts]


@pytest.mark.parametrize("name", NAMES)
def test_loads_a_transformers_state_dict(pair, name):
    """Fused experts as transformers holds them ([E, 2I, H], [E, H, I]) fill the same model as the checkpoint."""
    eng, hf, _ = pair(name)
    model = type(eng._model)(eng.model_config, torch.float32, "cpu")
    load_state_dict(model, {**hf.state_dict()})
    for (name, a), (_, b) in zip(model.named_parameters(), eng._model.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("name", NAMES)
def test_planner_counts_every_expert(pair, name):
    """The planner's bytes (from the config alone) are the model's own tensors' (a stacked shared expert too)."""
    from engine.model.shapes import model_tensor_shapes
    eng, _, _ = pair(name)
    cfg = eng.model_config
    shapes = model_tensor_shapes(cfg, with_mtp=False, with_vision=False)
    experts = cfg.num_experts * 3 * cfg.moe_intermediate_size * cfg.hidden_size
    assert sum(1 for n in shapes if ".experts." in n) == cfg.num_layers * cfg.num_experts * 3
    assert sum(torch.Size(s).numel() for n, (s, _) in shapes.items() if ".experts." in n) == cfg.num_layers * experts
    counted = policy_bytes(shapes, QuantPolicy(linear="float", embeddings="float"))["total"]
    bf16 = type(eng._model)(cfg, torch.bfloat16, "meta")     # every parameter, as a 16-bit load holds it
    assert counted == sum(p.numel() * p.element_size() for p in bf16.parameters())


def test_int4_moe_close_to_its_16bit_self(checkpoint):
    """moe128 with int4 experts (and shared expert, attention, GDN): greedy top-1 agreement with its 16-bit self
    over a teacher-forced sequence (printed with -s)."""
    path = checkpoint("moe128")
    kw = dict(model=str(path), device="cpu", dtype="float32", max_context=256, quant_group=64)
    full, quant = Engine(EngineConfig(**kw, weights="bf16")), Engine(EngineConfig(**kw, weights="int4"))
    try:
        assert quant._model.layers[0].mlp.gate_up.scheme == "int4"
        quant._warm_up_linears()      # (run on CUDA loads) runs each kind of MoE layer, never the stacked weights
        ids = torch.randint(0, full.model_config.vocab_size, (96,), generator=torch.Generator().manual_seed(7))
        a, b = full.score(ids.tolist()), quant.score(ids.tolist())
        agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        print(f"moe128 int4 top-1 agreement {agree:.3f}")
        assert agree > 0.8
    finally:
        full.close()
        quant.close()


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["bf16", "int4"])
@pytest.mark.parametrize("profile", ["C2", "C4"])
def test_gpu_moe_engine_greedy_is_its_own_forward(checkpoint, weights, profile):
    """On CUDA, with decode and speculative rounds in CUDA graphs (the decode kernels: no host sync; at C4 a
    round's verify rows are 4 x 4 = 16 tokens, above MOE_DECODE_MAX_T): greedy decode is the argmax of one full
    forward over each finished sequence (at 90% of the steps or more: bf16), and the prompt's logits agree with the
    fp32 CPU model's."""
    path = checkpoint("moe128")
    cpu = Engine(EngineConfig(model=str(path), device="cpu", dtype="float32", max_context=256))
    gpu = Engine(EngineConfig(model=str(path), device="cuda", max_context=512, profile=profile, weights=weights,
                              quant_group=64, cuda_graphs=True))
    try:
        assert gpu._runner.graphs is not None and gpu._spec.graphs is not None
        assert gpu._model.layers[0].mlp.shared_expert is None           # stacked as expert E
        prompts = [torch.randint(0, cpu.model_config.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
                   .tolist() for n in (40, 77, 19, 58)[:int(profile[1])]]
        handles = [gpu.submit(p, SamplingParams(max_tokens=16, **GREEDY)) for p in prompts]
        outs = [[t for ev in h for t in ev.token_ids] for h in handles]
        for p, out in zip(prompts, outs):
            full = gpu.score(p + out).float()       # bf16: decode and prefill kernels round differently
            same = (full[len(p) - 1:-1].argmax(-1).cpu() == torch.tensor(out)).float().mean().item()
            assert same >= 0.9, same
            agree = (full[:len(p)].argmax(-1).cpu() == cpu.score(p).argmax(-1)).float().mean().item()
            assert agree > (0.95 if weights == "bf16" else 0.75), agree
    finally:
        gpu.close()
        cpu.close()


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["bf16", "int4"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_gpu_moe_decode_graphs_equal_eager(checkpoint, weights, drafts):
    """Greedy decode replayed from CUDA graphs (plain steps, or speculative rounds of 2 drafts) is the same engine's
    eager decode, token for token: the same kernels on the same rows."""
    path = checkpoint("moe128")
    prompts = [torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (17, 40)]
    outs = {}
    for graphs in (False, True):
        eng = Engine(EngineConfig(model=str(path), device="cuda", max_context=512, weights=weights, quant_group=64,
                                  speculative_tokens=drafts, cuda_graphs=graphs))
        try:
            assert (eng._runner.graphs is not None) == graphs
            vocab = eng.model_config.vocab_size
            outs[graphs] = [eng.generate([t % vocab for t in p], SamplingParams(max_tokens=24, **GREEDY)).token_ids
                            for p in prompts]
        finally:
            eng.close()
    assert outs[True] == outs[False]


def test_speculative_rounds_with_an_moe_mtp_layer_equal_plain_greedy(pair):
    """The MTP layer of an MoE model is an MoE layer too: rounds of 3 drafts keep greedy output exact."""
    eng, _, path = pair("moe")
    spec = Engine(EngineConfig(model=str(path), device="cpu", dtype="float32", speculative_tokens=3))
    try:
        assert spec._model.mtp is not None and type(spec._model.mtp.layer.mlp).__name__ == "SparseMoE"
        ids = torch.randint(0, eng.model_config.vocab_size, (31,), generator=torch.Generator().manual_seed(8)).tolist()
        out = spec.generate(ids, SamplingParams(max_tokens=20, **GREEDY))
        assert out.token_ids == eng.generate(ids, SamplingParams(max_tokens=20, **GREEDY)).token_ids
        assert spec.stats()["spec_rounds"] > 0
    finally:
        spec.close()

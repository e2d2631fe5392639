"""Int4 weights end to end on the CPU: a tiny checkpoint quantized on load generates close to its
16-bit self, and the second load comes from the conversion cache."""

import time
from dataclasses import replace

import pytest
import torch

from engine.api import Engine, EngineConfig, SamplingParams
from engine.core.device import probe
from engine.core.memory import plan_for


def make(path, **kw):
    return Engine(EngineConfig(model=str(path), device="cpu", dtype="float32", max_context=512, quant_group=64, **kw))


@pytest.fixture(scope="module")
def engines(checkpoint):
    path = checkpoint("calm128")   # random weights scaled down: a network calm enough to measure quality on
    full = make(path, weights="bf16")
    t0 = time.perf_counter()
    quant = make(path, weights="int4")
    first_load = time.perf_counter() - t0
    yield path, full, quant, first_load
    full.close()
    quant.close()


def test_int4_weights_are_really_quantized(engines):
    _, _, quant, _ = engines
    schemes = {m.prefix + "|".join(m.parts): m.scheme for m in quant._model.modules() if hasattr(m, "scheme")}
    assert schemes["layers.0.linear_attn.in_proj_qkv|in_proj_z"] == "int4"
    assert schemes["layers.0.mlp.gate_proj|up_proj"] == "int4" and schemes["layers.0.mlp.down_proj"] == "int4"
    assert schemes["layers.0.linear_attn.in_proj_b|in_proj_a"] == "float"
    assert schemes["layers.3.self_attn.q_proj|k_proj|v_proj"] == "int4"
    assert schemes["embed_tokens"] == "int8" and schemes["lm_head"] == "int8"
    assert quant._model.lm_head.planes == 2 and quant._model.embed.planes == 1     # the table gathers rows
    assert quant.weights == "int4" and quant.plan().weights_bytes < engines[1].plan().weights_bytes


TOP1_FLOOR = 0.85   # measured on calm128, group 64: ALS 0.90, RTN 0.89 (the chaotic "base" fixture: ~0.5)


def test_int4_top1_agreement_with_its_16bit_self(engines):
    """Teacher-forced over 8 random prompts: the argmax of int4 logits equals the 16-bit argmax for at
    least TOP1_FLOOR of the positions (measured: printed with -s)."""
    _, full, quant, _ = engines
    agree = total = 0
    for seed in range(8):
        ids = torch.randint(0, 600, (96,), generator=torch.Generator().manual_seed(seed)).tolist()
        a, b = full.score(ids), quant.score(ids)
        agree += (a.argmax(-1) == b.argmax(-1)).sum().item()
        total += len(ids)
    rate = agree / total
    print(f"int4 vs 16-bit top-1 agreement: {rate:.3f}")
    assert rate >= TOP1_FLOOR


def test_second_load_hits_the_conversion_cache(engines):
    path, _, quant, first_load = engines
    t0 = time.perf_counter()
    again = make(path, weights="int4")
    second_load = time.perf_counter() - t0
    try:
        ids = list(range(5, 60))
        assert torch.equal(again.score(ids), quant.score(ids))
    finally:
        again.close()
    assert second_load < first_load


def test_plan_counts_int4_bytes(checkpoint):
    cfg = EngineConfig(model=str(checkpoint("base")), device="cpu", quant_group=64, max_context=512)
    bf16 = plan_for(replace(cfg, weights="bf16"), probe("cpu"))
    int4 = plan_for(replace(cfg, weights="int4"), probe("cpu"))
    assert int4.weights_bytes < bf16.weights_bytes


def test_generation_works_with_int4(engines):
    _, _, quant, _ = engines
    out = quant.generate(list(range(10, 40)), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 8


def test_warm_up_runs_every_quantized_shape_at_the_gemv_row_buckets(engines, monkeypatch):
    """On CUDA the int4 GEMV has a build for M > 1 and the dot GEMV (int8 and int4) tunes per M bucket (16, 32, and the
    fused GEMM's 64 .. FUSED_MAX_M): a prompt's short last step or a chat turn would compile and tune them on first
    use (seconds), so the engine runs every quantized weight shape at one row count per bucket before serving
    (called here on the CPU, where the ops are the references)."""
    from qwendesk_kernels import quant as kernels_quant
    from qwendesk_kernels.gemv_dot import m_bucket
    from qwendesk_kernels.quant import FUSED_MAX_M, WARM_UP_ROWS
    assert WARM_UP_ROWS[0] == 2 and {m_bucket(m) for m in range(9, FUSED_MAX_M + 1)} == set(WARM_UP_ROWS[1:])
    _, _, quant, _ = engines
    seen = set()
    for name in ("int4_linear", "int8_linear"):            # what qwendesk_kernels.quant.matmul calls
        real = getattr(kernels_quant, name)
        monkeypatch.setattr(kernels_quant, name, lambda x, w, real=real, name=name: (
            seen.add((name, tuple(w.shape), x.shape[0])), real(x, w))[1])
    quant._warm_up_linears()
    model = quant._model
    served = [m for name, m in model.named_modules()
              if hasattr(m, "scheme") and m.scheme != "float" and name != "embed"]
    kernels = {("int4_linear" if m.int4_tiles else "int8_linear", tuple(m.quantized().shape))
               for m in served + [model.lm_head]}
    assert {(kernel, shape, rows) for kernel, shape in kernels for rows in WARM_UP_ROWS} == seen

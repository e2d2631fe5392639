"""The consumer-GPU cost model's arithmetic (engine/readiness/cost_model.py, projection.py): no timing, no GPU."""

import pytest

from engine.readiness.cost_model import GPUS, Calibration, Gpu, Measured, Phase, Step, fit, phase_time, solve

CARD = Gpu("test card", 1e12, 100e12, 100, 1e9, 64, 1e-6, "made up")


def test_phase_is_the_larger_of_read_and_math_plus_unpack():
    cal = Calibration(stream=0.5, unpack_cycles=0.01, unpack_row_cycles=0.001, mma=0.5)
    t = phase_time(Phase("p", bytes=1e9, flops=10e12, int4_weights=1e9, rows=3), CARD, cal)
    assert t.read == pytest.approx(2e-3)                            # 1 GB at 0.5 TB/s
    assert t.math == pytest.approx(0.2)                             # 10 TFLOP at 50 TFLOP/s
    assert t.unpack == pytest.approx(1e9 * 0.012 / (100 * 1e9))     # (0.01 + 2 x 0.001) cycles per weight
    assert t.seconds == pytest.approx(0.2 + 1.2e-4) and t.bound == "math"
    assert phase_time(Phase("q", bytes=1e9), CARD, cal).bound == "memory"
    lanes = Gpu(**{**CARD.__dict__, "int_lanes": 128})              # twice the integer lanes: half the unpack
    assert phase_time(Phase("p", int4_weights=1e9), lanes, cal).unpack == pytest.approx(1e9 * 0.01 / (100 * 1e9) / 2)


def test_the_unpack_follows_the_gemv_that_runs():
    """The mma GEMV (the default up to 32 rows) unpacks once per column tile of up to 8 rows; the dot GEMV (past 16
    rows in rows measured before 2026-12-08: mma_max_m=16) per row."""
    from engine.readiness.projection import gemv_kernel
    from qwendesk_kernels.gemv_mma import GEMV_MMA_MAX_M
    cal = Calibration(unpack_cycles=0.01, unpack_row_cycles=0.001, dot_row_cycles=0.004)

    def cycles(max_m):
        return {rows: phase_time(Phase("p", int4_weights=1e9, rows=rows, kernel=gemv_kernel(rows, max_m)), CARD,
                                 cal).unpack * 100 for rows in (1, 8, 9, 16, 17, 32)}
    assert GEMV_MMA_MAX_M == 32 and [gemv_kernel(r) for r in (16, 32, 33)] == ["mma", "mma", "dot"]
    assert [gemv_kernel(r, 16) for r in (16, 17)] == ["mma", "dot"]
    assert cycles(16) == pytest.approx({1: 0.01, 8: 0.017, 9: 0.027, 16: 0.034, 17: 0.068, 32: 0.128})
    assert cycles(None) == pytest.approx({1: 0.01, 8: 0.017, 9: 0.027, 16: 0.034, 17: 0.044, 32: 0.068})


def test_step_adds_launch_gaps_round_and_moe_time():
    cal = Calibration(stream=1.0, round_seconds=1e-3, moe_layer_seconds=1e-5)
    phases = (Phase("a", bytes=1e9), Phase("b", bytes=2e9))
    assert Step(phases, 100).seconds(CARD, cal) == pytest.approx(3e-3 + 100e-6)
    assert Step(phases, 100, round=True, moe_layers=40).seconds(CARD, cal) == pytest.approx(3e-3 + 100e-6 + 1e-3
                                                                                             + 40e-5)
    assert Step(phases, 0, tokens=6).tok_s(CARD, cal) == pytest.approx(2000)


def test_solve_finds_the_crossing():
    assert solve(lambda x: x * x - 2, 0, 2) == pytest.approx(2 ** 0.5)
    assert solve(lambda x: 1 - x, 0, 4) == pytest.approx(1)


def test_fit_recovers_the_constants_the_rows_were_made_with():
    truth = Calibration(stream=0.8, unpack_cycles=0.02, unpack_row_cycles=0.002, mma=0.55, round_seconds=2e-3)
    gpu = "h200"
    bf16 = Step((Phase("w", bytes=50e9, flops=1e11),), 500)
    int4_c1 = Step((Phase("w", bytes=14e9, flops=6e11, int4_weights=27e9, rows=1),), 500)
    int4_c8 = Step((Phase("w", bytes=14e9, flops=6e11, int4_weights=27e9, rows=8),), 500)
    prefill = Step((Phase("gemm", bytes=54e9, flops=54e9 * 8192),), 300)
    spec = Step((Phase("w", bytes=14e9, flops=6e11, int4_weights=27e9, rows=4),), 900, round=True)
    steps = {"bf16": bf16, "c1": int4_c1, "c8": int4_c8, "prefill": prefill, "round": spec}
    rows = {k: Measured(k, gpu, (s,), s.seconds(GPUS[gpu], truth), "made up") for k, s in steps.items()}
    order = (("stream", "bf16", 0.3, 1.0), ("unpack_cycles", "c1", 0.0, 1.0), ("unpack_row_cycles", "c8", 0.0, 1.0),
             ("mma", "prefill", 0.05, 1.0), ("round_seconds", "round", 0.0, 0.05))
    cal = fit(rows, order)
    for name in ("stream", "unpack_cycles", "unpack_row_cycles", "mma", "round_seconds"):
        assert getattr(cal, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    assert all(abs(r.error(cal)) < 1e-9 for r in rows.values())


def test_gemv_flops_follow_the_kernels_padding():
    from engine.readiness.model_facts import Group
    from engine.readiness.projection import gemv_flops
    int4 = Group(bytes=0.5, params=1, int4=1)
    assert [gemv_flops(int4, m) for m in (1, 8, 9, 16, 17, 32, 48)] == [24, 24, 48, 48, 72, 96, 128]
    assert [gemv_flops(int4, m, mma_max_m=16) for m in (16, 17, 32)] == [48, 64, 64]
    assert gemv_flops(Group(bytes=2, params=1), 5) == 10               # a 16-bit weight: 2 per row


def test_expert_share():
    from types import SimpleNamespace

    from engine.readiness.model_facts import expert_share
    cfg = SimpleNamespace(num_experts=256, num_experts_per_tok=8)
    assert expert_share(cfg, 1) == pytest.approx(8 / 256)
    assert expert_share(cfg, 8) == pytest.approx(1 - (248 / 256) ** 8)
    assert expert_share(SimpleNamespace(num_experts=0, num_experts_per_tok=0), 8) == 0


def test_27b_facts_count_the_model_tensors_the_bench_counts():
    """The 27B int4 step reads what the bench's roofline counts (engine/bench_figures.weight_bytes: 14.33 GB at
    27B shapes, docs/performance.md), split into layers and LM head; 8 int4 weights per packed word."""
    from engine.bench.figures import weight_bytes
    from engine.readiness.forward import model_on_meta
    from engine.readiness.model_facts import model_facts
    m = model_facts("27b", "int4")
    assert m.dense.bytes + m.head.bytes == weight_bytes(model_on_meta("27b", "int4", layers=64))
    assert 14.2e9 < m.dense.bytes + m.head.bytes < 14.4e9
    assert m.dense.int4 == pytest.approx(2 * m.dense.bytes, rel=0.1)   # half a byte each, plus scales and zeros
    assert m.experts.bytes == 0 and m.mtp.int4 > 0
    bf16 = model_facts("27b", "bf16")
    assert bf16.dense.int4 == 0 and bf16.dense.params == pytest.approx(m.dense.int4, rel=0.01)


# Launches are recorded by running the engine's forward with Triton's compiler path, not its interpreter (which the
# test session runs under): in a process of its own, as tests/test_readiness.py does.
RECORDED = """
import json
from engine.readiness.cost_model import GPUS, Calibration
from engine.readiness.model_facts import model_facts
from engine.readiness.projection import decode_step, launches
m = model_facts("27b", "int4")
cal = Calibration(stream=1.0)
print(json.dumps(dict(step=launches("decode", "27b", "int4", 1, 0), round=launches("round", "27b", "int4", 1, 3),
                      tok_s={k: decode_step(m, 1).tok_s(GPUS[k], cal) for k in ("rtx3090", "rtx4090", "rtx5090")},
                      roofline={k: GPUS[k].bandwidth / (m.dense.bytes + m.head.bytes)
                                for k in ("rtx3090", "rtx4090", "rtx5090")})))
"""


@pytest.fixture(scope="module")
def recorded():
    from tests.test_readiness import run_check_code
    return run_check_code(RECORDED)


def test_projection_stays_under_the_cards_roofline(recorded):
    """Whatever the calibration, a projected decode step reads at least the weights at the card's full bandwidth."""
    for key, tok_s in recorded["tok_s"].items():
        assert 0.5 * recorded["roofline"][key] < tok_s < recorded["roofline"][key]


def test_rounds_record_more_launches_than_a_step(recorded):
    assert recorded["step"] > 4 * 64                                  # four GEMVs per layer at least
    assert recorded["round"] > recorded["step"]


def test_the_block_drafters_weights_split_into_its_block_and_its_context_writes():
    """A block's forward reads every drafter weight but fc; the context writes of the target's rows read fc and each
    layer's k | v rows again; int4 as the engine holds them."""
    from engine.bench.random_model import drafter_config
    from engine.model.drafter_config import drafter_parameters, parse_drafter_config
    from engine.readiness.model_facts import drafter_facts
    cfg = parse_drafter_config(drafter_config("27b"))
    block, context = drafter_facts("27b", "int4")
    h, kv = cfg.hidden_size, 2 * cfg.num_kv_heads * cfg.head_dim
    fc = len(cfg.target_layer_ids) * h * h
    assert context.params == fc + cfg.num_layers * kv * h
    norms = (2 * cfg.num_layers + 2) * h + 2 * cfg.num_layers * cfg.head_dim
    assert block.params == drafter_parameters(cfg) - norms - fc
    assert block.int4 == block.params and context.int4 == context.params       # every projection int4 here
    assert 0.5 < block.bytes / (block.params / 2) < 1.2                         # ~4 bits a weight, with scales

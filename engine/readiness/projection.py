"""PROJECTED figures for the RTX 3090 / 4090 / 5090 (`make project-consumer`; issue #43), from the cost model
(engine/readiness/cost_model.py) calibrated on measured H200 rows and checked against measured H100 rows.

The steps are counted from the engine's own model, nothing launched: its tensors built on the meta device (bytes,
int4 weights, parameters per group: engine/readiness/model_facts.py), its config (KV and GDN state per sequence,
attention heads), and its kernel launches recorded from the real forward on the meta device
(engine/readiness/launches.py: every Triton launch, plus each torch op that runs a kernel, e.g. cuBLAS GEMMs)."""

from __future__ import annotations

import argparse
import sys
from functools import cache
from typing import Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.cache.kv_format import KVFormat
from engine.readiness.cost_model import GPUS, Calibration, Measured, Phase, PhaseTime, Step, fit
from engine.readiness.model_facts import Group, ModelFacts, drafter_facts, expert_share, model_facts, moe_layers

DECODE_CONTEXT = 576          # the bench's decode: 512-token prompts, mean context over its 128 tokens
BENCH_CHUNK = 8192            # the bench's --prefill-chunk (the measured TTFTs)


def gemv_kernel(rows: int, mma_max_m: int | None = None) -> Literal["mma", "dot"]:
    """The int4 GEMV the default runs at `rows` rows (qwendesk_kernels/quant.py int4_linear); mma_max_m: the mma
    GEMV's limit where a measured row ran with another than today's (GEMV_MMA_MAX_M)."""
    from qwendesk_kernels.gemv_mma import GEMV_MMA_MAX_M
    return "mma" if rows <= (mma_max_m or GEMV_MMA_MAX_M) else "dot"


def gemv_flops(g: Group, rows: int, mma_max_m: int | None = None) -> float:
    """Tensor FLOPs a GEMV of `rows` rows issues over `g`: an int4 weight costs 24 per column tile of 8 rows in the
    mma GEMV (m16n8k16 with x padded to 8 columns, 16 per weight and 8 for the x sums: qwendesk_kernels/gemv_mma.py),
    else 2 per row padded to its M bucket (the dot GEMV's tl.dot: 32, then M tiles of up to 64 / 128); a 16-bit one
    2 per row."""
    from qwendesk_kernels.gemv_dot import m_bucket
    from qwendesk_kernels.gemv_mma import X_TILE
    per_int4 = 24 * -(-rows // X_TILE) if gemv_kernel(rows, mma_max_m) == "mma" else 2 * m_bucket(rows)
    return g.int4 * per_int4 + 2 * (g.params - g.int4) * rows


def gemv(name: str, g: Group, rows: int, mma_max_m: int | None = None) -> Phase:
    return Phase(name, g.bytes, gemv_flops(g, rows, mma_max_m), g.int4, rows, gemv_kernel(rows, mma_max_m))


def weight_phases(m: ModelFacts, seqs: int, rows: int, mma_max_m: int | None = None) -> list[Phase]:
    """The weights' GEMVs of seqs x rows tokens (a dense model's, an MoE's routed experts read by someone)."""
    t = seqs * rows
    out = [gemv("weights", m.dense, t, mma_max_m)]
    if m.cfg.num_experts:
        share = expert_share(m.cfg, t)
        per_expert = max(1, round(t * m.cfg.num_experts_per_tok / (m.cfg.num_experts * share)))  # rows of each
        e = m.experts * share
        out.append(Phase("experts", e.bytes, gemv_flops(e, per_expert), e.int4, per_expert))
    return out


def attention(name: str, m: ModelFacts, layers: int, seqs: int, rows: int, context: int, kv_int8: bool) -> Phase:
    """Attention of `layers` layers over each sequence's KV at `context` tokens (read once for its rows)."""
    from engine.core.memory import kv_bytes_per_token
    kv = kv_bytes_per_token(m.cfg, torch.bfloat16, False, KVFormat.INT8 if kv_int8 else KVFormat.BF16)
    per_layer = kv / len(m.cfg.full_attention_layers)
    return Phase(name, layers * seqs * context * per_layer,
                 4 * layers * seqs * rows * context * m.cfg.num_heads * m.cfg.head_dim)


def gdn_state(name: str, m: ModelFacts, seqs: int) -> Phase:
    """Every GDN layer's state of `seqs` sequences, read and written."""
    from engine.core.memory import state_bytes_per_slot
    return Phase(name, 2 * seqs * state_bytes_per_slot(m.cfg, torch.bfloat16))


def decode_step(m: ModelFacts, seqs: int, context: int = DECODE_CONTEXT, kv_int8: bool = False) -> Step:
    full = len(m.cfg.full_attention_layers)
    return Step((*weight_phases(m, seqs, 1), gemv("LM head", m.head, seqs),
                 attention("attention", m, full, seqs, 1, context, kv_int8), gdn_state("GDN state", m, seqs)),
                launches("decode", m.shape, m.weights, seqs, 0), seqs, moe_layers=moe_layers(m))


def spec_round(m: ModelFacts, seqs: int, drafts: int, tokens_per_round: float, context: int = DECODE_CONTEXT,
               kv_int8: bool = False, mma_max_m: int | None = None) -> Step:
    """A speculative round (engine/spec/rounds.py): k - 1 MTP draft steps of one row, the verify of k + 1 rows and
    its LM head, the GDN replay, the MTP catch-up of k + 1 rows; a draft head (EngineConfig.draft_vocab rows) after
    each MTP step. mma_max_m: see gemv_kernel."""
    from engine.core.params import EngineConfig
    rows, full = drafts + 1, len(m.cfg.full_attention_layers)
    draft_head = m.head * (EngineConfig.draft_vocab / m.cfg.vocab_size)
    phases = [*weight_phases(m, seqs, rows, mma_max_m), gemv("LM head", m.head, seqs * rows, mma_max_m),
              attention("attention", m, full, seqs, rows, context, kv_int8), gdn_state("GDN state", m, seqs),
              gdn_state("GDN replay", m, seqs)]
    for r in [1] * (drafts - 1) + [rows]:
        phases += [gemv("MTP", m.mtp, seqs * r, mma_max_m), attention("MTP attention", m, 1, seqs, r, context, kv_int8)]
    phases += [gemv("draft head", draft_head, seqs)] * drafts
    return Step(tuple(phases), launches("round", m.shape, m.weights, seqs, drafts), seqs * tokens_per_round, True,
                moe_layers(m))


def block_round(m: ModelFacts, seqs: int, drafts: int, tokens_per_round: float, context: int = DECODE_CONTEXT) -> Step:
    """A block drafter's round (engine/spec/block_rounds.py): the drafter's forward over each sequence's 16-row block
    (its attention over the context; sliding layers over their window), the draft head over the k draft rows, the
    verify of k + 1 rows with the drafter's context writes of those rows, and the GDN replay."""
    from engine.bench.random_model import drafter_config
    from engine.core.params import EngineConfig
    from engine.model.drafter_config import parse_drafter_config
    cfg = parse_drafter_config(drafter_config(m.shape))
    block_weights, context_weights = drafter_facts(m.shape, m.weights)
    rows, block, full = drafts + 1, cfg.block_size, len(m.cfg.full_attention_layers)
    draft_head = m.head * (EngineConfig.draft_vocab / m.cfg.vocab_size)
    kv_per_token = 2 * cfg.num_kv_heads * cfg.head_dim * 2                     # bf16 context K and V, one layer
    keys = [min(context + block, cfg.window(i) or context + block) for i in range(cfg.num_layers)]
    drafter_attention = Phase("drafter attention", seqs * kv_per_token * sum(keys),
                              4 * seqs * block * sum(keys) * cfg.num_heads * cfg.head_dim)
    phases = [gemv("drafter", block_weights, seqs * block), drafter_attention,
              gemv("draft head", draft_head, seqs * drafts),
              *weight_phases(m, seqs, rows), gemv("LM head", m.head, seqs * rows),
              attention("attention", m, full, seqs, rows, context, False), gdn_state("GDN state", m, seqs),
              gdn_state("GDN replay", m, seqs), gemv("drafter context", context_weights, seqs * rows)]
    return Step(tuple(phases), launches("block", m.shape, m.weights, seqs, drafts), seqs * tokens_per_round, True,
                moe_layers(m))


def prefill(m: ModelFacts, tokens: int, chunk: int, mtp: bool) -> list[Step]:
    """The chunks of a `tokens`-token prompt: int4 weights are dequantized to bf16 per chunk (read 4 bits, write 16)
    and multiplied by cuBLAS; attention is causal over the context so far; the MTP layer runs on every token when
    the model speculates."""
    cfg = m.cfg
    heads = len(cfg.full_attention_layers) * cfg.num_heads * cfg.head_dim
    gdn = len(cfg.linear_attention_layers) * cfg.linear_num_v_heads * cfg.linear_k_head_dim * cfg.linear_v_head_dim
    w = m.dense + m.experts + (m.mtp if mtp else Group())
    active = m.dense.params + (m.mtp.params if mtp else 0) + m.experts.params * (
        cfg.num_experts_per_tok / cfg.num_experts if cfg.num_experts else 0)
    steps = []
    for start in range(0, tokens, chunk):
        t = min(chunk, tokens - start)
        dequant = [Phase("dequantize", w.bytes + 2 * w.int4)] if w.int4 else []
        steps.append(Step((*dequant, Phase("GEMMs", 2 * w.params, 2 * active * t),
                           Phase("attention", 0, 4 * t * (start + t / 2) * heads),
                           Phase("GDN chunks", 0, 6 * t * gdn),
                           gemv("LM head", m.head, 1)),
                          launches("prefill", m.shape, m.weights, 1, 0), t))
    return steps


class _KernelOps(TorchDispatchMode):
    """Counts the torch ops of a forward that run a kernel (not views, not allocations)."""
    FREE = {"empty", "empty_like", "empty_strided", "new_empty", "detach", "lift_fresh", "alias", "_to_copy",
            "_local_scalar_dense", "zeros", "set_"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ not in self.FREE:
            self.count += 1
        return func(*args, **(kwargs or {}))


@cache
def launches(what: str, shape: str, weights: str, seqs: int, drafts: int) -> int:
    """Kernel launches of one decode step of `seqs` sequences, one round of `drafts` drafts, or one prefill chunk
    of 2,048 tokens, recorded from the engine's forward at the model's full depth on the meta device."""
    from engine.model.batch import build_batch
    from engine.readiness import forward as fw
    from engine.readiness.launches import recording
    from engine.spec.rounds import RoundRunner
    from engine.bench.random_model import text_config
    layers = text_config(shape)["num_hidden_layers"]
    with recording() as rec, torch.inference_mode():
        model = fw.model_on_meta(shape, weights, layers)
        pools = fw.pools_on_meta(model, KVFormat.BF16)
        per_seq = (fw.CONTEXT + 2 * fw.PAGE) // fw.PAGE
        tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(max(seqs, 1))]
        ids = lambda n: torch.zeros(n, dtype=torch.int64, device="meta")  # noqa: E731
        if what == "decode":
            batch = build_batch([1] * seqs, [fw.CONTEXT - 1] * seqs, list(range(seqs)), tables, fw.PAGE, "meta")
            with _KernelOps() as ops:
                fw._sample(model.logits(model(ids(seqs), batch, pools)))
        elif what == "prefill":
            rows = 2048
            batch = build_batch([rows], [fw.CONTEXT - rows], [0], tables[:1], fw.PAGE, "meta")
            fw._fla_index(batch, [0, rows])
            with _KernelOps() as ops:
                hidden = model(ids(rows), batch, pools)
                model.mtp_forward(ids(rows), hidden, batch, pools)
                model.logits(hidden[batch.logits_rows])
        elif what == "block":
            from engine.bench.random_model import drafter_config
            from engine.cache.pages import CacheTensors
            from engine.model.block_drafter import BlockDrafter
            from engine.model.drafter_config import parse_drafter_config
            from engine.model.linear import Build
            from engine.spec.block_rounds import BlockRoundRunner
            model = fw.model_on_meta(shape, weights, layers)
            cfg = parse_drafter_config(drafter_config(shape))
            model.attach_drafter(BlockDrafter(cfg, Build(torch.bfloat16, "meta", fw.DEFAULTS.policy(weights))))
            pools = CacheTensors.allocate(model.cfg, len(tables) * per_seq, fw.PAGE, 9, torch.bfloat16, "meta",
                                          drafter=cfg)
            block_spec = BlockRoundRunner(model, pools, drafts, seqs, fw.CONTEXT + fw.PAGE, fw.DEFAULTS.draft_vocab)
            inp = fw.round_inputs_on_meta(tables[:seqs])
            with _KernelOps() as ops:
                block_spec.round(inp, False, drafts)
        else:
            spec = RoundRunner(model, pools, drafts, seqs, fw.CONTEXT + fw.PAGE)
            inp = fw.round_inputs_on_meta(tables[:seqs])
            with _KernelOps() as ops:
                spec.round(inp, False, drafts)
    return len(rec.launches) + ops.count


# --- measured rows (docs/performance.md) ---------------------------------------------------------------------------

def measured() -> dict[str, Measured]:
    """The figures the calibration is fitted on (H200) and checked against (H100 and other H200 rows)."""
    i4, b16 = model_facts("27b", "int4"), model_facts("27b", "bf16")
    rows = [
        Measured("27B bf16 C1 step", "h200", (decode_step(b16, 1),), 14.24e-3, "2026-12-02 fourteenth, 70.2 tok/s"),
        Measured("27B int4 C1 step", "h200", (decode_step(i4, 1),), 5.76e-3, "2026-12-02 fourteenth, 173.5 tok/s"),
        Measured("27B int4 C8 step", "h200", (decode_step(i4, 8),), 7.17e-3, "2026-12-02 fourteenth, 1,115.8 tok/s"),
        Measured("27B int4 TTFT 8K", "h200", tuple(prefill(i4, 8192, BENCH_CHUNK, False)), 8192 / 11_483.9,
                 "2026-12-02 thirteenth, 11,484 tok/s"),
        Measured("27B int4 k=3 round", "h200", (spec_round(i4, 1, 3, 3.0),), 9.0e-3,
                 "2026-12-02 fourteenth, before rounds in flight"),
        Measured("27B int4 k=5 round", "h200", (spec_round(i4, 1, 5, 3.0),), 10.8e-3,
                 "2026-12-02 fourteenth, before rounds in flight"),
        Measured("27B bf16 C8 step", "h200", (decode_step(b16, 8),), 15.57e-3, "2026-12-02 fourteenth, 513.5 tok/s"),
        Measured("27B bf16 k=3 round", "h200", (spec_round(b16, 1, 3, 3.0),), 17.2e-3,
                 "2026-12-02 fourteenth, before rounds in flight"),
        Measured("27B int4 C1 step", "h100", (decode_step(i4, 1),), 1 / 142.7, "2026-12-06, spec off 142.7 tok/s"),
        Measured("27B int4 C8 step", "h100", (decode_step(i4, 8),), 8 / 789.9,
                 "2026-12-06, spec off 789.9 tok/s (plain C8 moved 521-897 there)"),
        Measured("27B int4 TTFT 8K", "h100", tuple(prefill(i4, 8192, BENCH_CHUNK, False)), 745.8e-3,
                 "2026-12-06, spec off"),
        Measured("27B int4 TTFT 32K", "h100", tuple(prefill(i4, 32768, BENCH_CHUNK, False)), 3234e-3,
                 "2026-12-06, spec off"),
        Measured("27B int4 k=3 round", "h100", (spec_round(i4, 1, 3, 3.02),), 3.02 / (1.98 * 137.7),
                 "2026-12-06: 1.98x of 137.7 tok/s at 3.02 tokens/round, before rounds in flight"),
        Measured("27B int4 k=3 round, in flight", "h100", (spec_round(i4, 1, 3, 3.04),), 9.80e-3,
                 "2026-12-07 seventh: rounds launched from the one in flight, a round's span = its GPU time"),
        Measured("27B int4 C2 step", "h100", (decode_step(i4, 2),), 8.46e-3, "2026-12-08 eighth, 236.4 tok/s"),
        Measured("27B int4 C4 step", "h100", (decode_step(i4, 4),), 8.52e-3, "2026-12-08 eighth, 469.3 tok/s"),
        Measured("27B int4 C2 k=3 round", "h100", (spec_round(i4, 2, 3, 3.04),), 10.80e-3,
                 "2026-12-08 eighth, median round"),
        Measured("27B int4 C4 k=3 round", "h100", (spec_round(i4, 4, 3, 3.04),), 15.51e-3,
                 "2026-12-08 eighth, median round"),
        Measured("27B int4 C8 k=3 round", "h100", (spec_round(i4, 8, 3, 3.04, mma_max_m=16),), 20.51e-3,
                 "2026-12-08 eighth, median round (the dot GEMV past 16 rows then)"),
        Measured("27B int4 block drafter k=5 round", "h100", (block_round(i4, 1, 5, 4.23),), 12.14e-3,
                 "2026-12-07 second session: the fused drafter, 12.14 ms a round (a check, not fitted)"),
        Measured("9B bf16 C1 step", "h100", (decode_step(model_facts("9b", "bf16"), 1),), 1 / 163.9,
                 "FACTS 2026-12-06, 163.9 tok/s"),
        Measured("35B-A3B int4 C1 step", "h100", (decode_step(model_facts("35b-a3b", "int4"), 1),), 1 / 421.8,
                 "FACTS 2026-12-06, 421.8 tok/s"),
        Measured("35B-A3B int4 C8 step", "h100", (decode_step(model_facts("35b-a3b", "int4"), 8),), 8 / 1951,
                 "FACTS 2026-12-06, 1,951 tok/s"),
    ]
    return {f"{r.gpu} {r.label}": r for r in rows}


# Each constant solved on one row, in this order (a constant a row does not depend on is solved first): streaming
# from a bf16 step (no unpack), the GEMV's unpack from int4 C1 and its growth per row from C8, the tensor fraction
# from a prefill, the round's own time from a k = 3 round of today's engine (rounds launched from the one in flight:
# the rows measured before that carry its host work, 10-20% more), the dot GEMV's cost per row from a C8 round (its
# 32-row verify, measured when the dot GEMV took 17-32 rows; today's default takes the mma GEMV there, so the C8
# projections now follow the mma terms); the MoE layers' own time from an MoE C1 row (H100). The C4 round (16 rows,
# the mma GEMV's two column tiles) is modelled 15% fast: a tile beyond the first costs more than the model's.
FIT = (("stream", "h200 27B bf16 C1 step", 0.3, 1.0), ("unpack_cycles", "h200 27B int4 C1 step", 0.0, 1.0),
       ("unpack_row_cycles", "h200 27B int4 C8 step", 0.0, 1.0), ("mma", "h200 27B int4 TTFT 8K", 0.05, 1.0),
       ("round_seconds", "h100 27B int4 k=3 round, in flight", 0.0, 0.05),
       ("dot_row_cycles", "h100 27B int4 C8 k=3 round", 0.0, 1.0),
       ("moe_layer_seconds", "h100 35B-A3B int4 C1 step", 0.0, 1e-3))
FITTED_ON = tuple(key for _, key, _, _ in FIT)


def calibration() -> tuple[Calibration, dict[str, Measured]]:
    rows = measured()
    return fit(rows, FIT), rows


# --- projections ----------------------------------------------------------------------------------------------------

def projections(gpu_key: str, cal: Calibration) -> list[tuple[str, float, str]]:
    """(figure, value, unit) for one card: what the engine would do there if its kernels ran as they do on the H200."""
    from engine.core.params import EngineConfig
    gpu = GPUS[gpu_key]
    chunk = EngineConfig(model="").prefill_chunk
    i4 = model_facts("27b", "int4")
    out = []
    for c in (1, 8):
        out.append((f"27B int4 decode C{c}", decode_step(i4, c).tok_s(gpu, cal), "tok/s"))
    out.append(("27B int4 decode C1 at 32K context, int8 KV", decode_step(i4, 1, 32768, True).tok_s(gpu, cal), "tok/s"))
    out.append(("27B int4 C1, MTP k=3 at 3.04 tokens/round", spec_round(i4, 1, 3, 3.04).tok_s(gpu, cal), "tok/s"))
    out.append(("27B int4 C1, MTP k=5 at 4.0 tokens/round", spec_round(i4, 1, 5, 4.0).tok_s(gpu, cal), "tok/s"))
    out.append(("27B int4 C8, MTP k=3 at 3.04 tokens/round", spec_round(i4, 8, 3, 3.04).tok_s(gpu, cal), "tok/s"))
    for k, accepted in ((7, 5.47), (15, 5.47), (15, 8.31)):   # exllamav3's DFlash2 length; Luce DFlash's (tree)
        out.append((f"27B int4 C1, block drafter k={k} at {accepted} tokens/round",
                    block_round(i4, 1, k, accepted).tok_s(gpu, cal), "tok/s"))
    for n in (8192, 32768):
        t = sum(s.seconds(gpu, cal) for s in prefill(i4, n, chunk, True))
        out.append((f"27B int4 TTFT {n // 1024}K (prefill {n / t:,.0f} tok/s)", t * 1e3, "ms"))
    nine = model_facts("9b", "bf16")
    for c in (1, 8):
        out.append((f"9B bf16 decode C{c}", decode_step(nine, c).tok_s(gpu, cal), "tok/s"))
    moe = model_facts("35b-a3b", "int4")
    out.append(("35B-A3B int4 decode C1", decode_step(moe, 1).tok_s(gpu, cal), "tok/s"))
    return out


def breakdown(step: Step, gpu_key: str, cal: Calibration) -> list[str]:
    """Where a step's projected time goes on a card, and what bounds each phase."""
    gpu = GPUS[gpu_key]
    total = step.seconds(gpu, cal)
    lines = []
    merged: dict[str, list] = {}
    for t in step.times(gpu, cal):
        merged.setdefault(t.name, []).append(t)
    for name, ts in sorted(merged.items(), key=lambda kv: -sum(t.seconds for t in kv[1])):
        s = sum(t.seconds for t in ts)
        sums = PhaseTime(name, *(sum(getattr(t, f) for t in ts) for f in ("read", "math", "unpack")))
        lines.append(f"    {name:16s} {s * 1e3:7.2f} ms {100 * s / total:5.1f}%  ({sums.bound}-bound; read "
                     f"{sums.read * 1e3:.2f}, math {sums.math * 1e3:.2f}, unpack {sums.unpack * 1e3:.2f} ms)")
    gaps = step.launches * gpu.launch
    lines.append(f"    {'launch gaps':16s} {gaps * 1e3:7.2f} ms {100 * gaps / total:5.1f}%  ({step.launches} launches)")
    fixed = (cal.round_seconds if step.round else 0.0) + step.moe_layers * cal.moe_layer_seconds
    if fixed:
        lines.append(f"    {'fixed (fitted)':16s} {fixed * 1e3:7.2f} ms {100 * fixed / total:5.1f}%  "
                     f"(a round's own time, MoE layers')")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="project-consumer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cards", nargs="*", default=["rtx3090", "rtx4090", "rtx5090"], choices=sorted(GPUS))
    args = ap.parse_args(argv)
    cal, rows = calibration()
    print(f"calibration (fitted on {', '.join(FITTED_ON)}):\n  stream {cal.stream:.3f} of copy bandwidth; int4 GEMV "
          f"unpack {1e3 * cal.unpack_cycles:.1f} SM cycles per 1,000 weights at one row + "
          f"{1e3 * cal.unpack_row_cycles:.2f} per further row of an mma column tile, the dot GEMV "
          f"{1e3 * cal.dot_row_cycles:.2f} per row; {1e6 * cal.moe_layer_seconds:.1f} us per MoE layer; MMA "
          f"{cal.mma:.3f} of the tensor peak; {1e3 * cal.round_seconds:.2f} ms per speculative round; launch gap "
          f"{GPUS['h200'].launch * 1e6:.2f} us")
    print(f"\n{'measured row':42s} {'measured':>9s} {'model':>9s} {'error':>7s}")
    for key, r in rows.items():
        mark = " (fitted)" if key in FITTED_ON else ""
        print(f"{key:42s} {r.seconds * 1e3:7.2f}ms {r.predicted(cal) * 1e3:7.2f}ms {100 * r.error(cal):+6.1f}%{mark}")
    for key in args.cards:
        print(f"\nPROJECTED, {GPUS[key].name} ({GPUS[key].source}); nothing was run on this card:")
        for name, value, unit in projections(key, cal):
            print(f"  {name:50s} {value:9,.1f} {unit}")
        i4 = model_facts("27b", "int4")
        for what, step in (("C1 decode step", decode_step(i4, 1)), ("C8 round, k = 3", spec_round(i4, 8, 3, 3.04))):
            print(f"  where a 27B int4 {what} goes:")
            for line in breakdown(step, key, cal):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

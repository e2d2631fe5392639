"""A cost model of the engine's forward steps, to project step times on cards we have no access to (issue #43).

A step (a decode step, a speculative round, a prefill chunk) is a list of Phases: the weights' GEMVs/GEMMs, the
LM head, attention over the KV cache, the GDN layers' state, an int4 prefill's dequantization. Each phase is
counted from the model's own tensors and config (engine/readiness/projection.py builds them): the bytes it reads,
its tensor math (FLOPs), and the int4 weights it unpacks. A card is its copy bandwidth, its bf16 tensor rate
(fp32 accumulate, dense), its SMs x clock x integer lanes, and a gap per launch inside a CUDA graph. On a card:

    phase time = max(bytes / (copy bandwidth x STREAM), FLOPs / (tensor peak x MMA)) + unpack
    unpack     = int4 weights x cycles per weight / (SMs x clock x lanes/64), where a GEMV's cycles per weight
                 follow its kernel: the mma GEMV (the default up to 32 rows) unpacks the weights once per column
                 tile of up to 8 rows, each tile at (cycles at one row + cycles per further row x (its rows - 1));
                 the dot GEMV (17-32 rows before 2026-12-08, a C8 verify) at cycles per row x rows
    step time  = sum of its phases + launches x launch gap (+ a round's own time, + per MoE layer a fixed time)

The unpack term is added, not overlapped: the H100 and H200 have the same SMs and clock but 3.0 against 4.2 TB/s,
and their int4 C1 steps differ by about the difference of their read times (7.0 against 5.8 ms) -- the part of an
int4 GEMV that is unpacking and mma issue is not hidden behind the reads on either. The calibration constants are
fitted on measured H200 rows and checked against H100 rows (projection.py prints both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from qwendesk_kernels.gemv_mma import X_TILE


@dataclass(frozen=True)
class Gpu:
    name: str
    bandwidth: float          # copy bandwidth, B/s (read + write of a device-to-device copy)
    tensor: float             # bf16 tensor FLOP/s, fp32 accumulate, dense
    sms: int
    clock: float              # boost clock, Hz
    int_lanes: int            # INT32 lanes per SM (the int4 unpack's issue rate)
    launch: float             # seconds between kernels in a CUDA graph
    source: str


# Specifications: NVIDIA's whitepapers (H100, Ada, Blackwell RTX) and the GA102 datasheet; the H100's and H200's
# copy bandwidths were measured (docs/performance.md 2026-12-06, FACTS 2026-11-30: 0.90 and 0.88 of their spec), the
# consumer cards' are 0.90 of their spec (an assumption); the graph launch gap 0.93 us was measured on the H200 and is
# assumed on every card.
GAP = 0.93e-6
GPUS = {
    "h100": Gpu("H100 SXM 80GB", 3.01e12, 989e12, 132, 1.98e9, 64, GAP, "measured copy 3.01 TB/s; 989 TFLOP/s"),
    "h200": Gpu("H200", 4.24e12, 989e12, 132, 1.98e9, 64, GAP, "measured copy 4.24 TB/s; 989 TFLOP/s"),
    "rtx3090": Gpu("RTX 3090", 0.9 * 936e9, 71e12, 82, 1.695e9, 64, GAP,
                   "936 GB/s, 71 TFLOP/s (fp32 acc.), GA102: 64 INT32 lanes per SM"),
    "rtx4090": Gpu("RTX 4090", 0.9 * 1008e9, 165.2e12, 128, 2.52e9, 64, GAP,
                   "1,008 GB/s, 165 TFLOP/s (fp32 acc.), AD102: 64 INT32 lanes per SM"),
    "rtx5090": Gpu("RTX 5090", 0.9 * 1792e9, 209.5e12, 170, 2.41e9, 128, GAP,
                   "1,792 GB/s, 210 TFLOP/s (fp32 acc.), GB202: all 128 lanes FP32/INT32"),
}


@dataclass(frozen=True)
class Calibration:
    stream: float = 0.9               # fraction of copy bandwidth a streaming kernel reaches
    unpack_cycles: float = 0.0        # SM cycles per int4 weight at one row (at 64 INT32 lanes)
    unpack_row_cycles: float = 0.0    # SM cycles per int4 weight per further row (of an mma column tile)
    dot_row_cycles: float = 0.0       # SM cycles per int4 weight per row in the dot GEMV
    mma: float = 0.6                  # fraction of the tensor peak prefill GEMMs and attention reach
    moe_layer_seconds: float = 0.0    # per MoE layer and step, beyond its phases (its small routing kernels' latency)
    round_seconds: float = 0.0        # per speculative round, beyond its phases and launches (host work, syncs)


@dataclass(frozen=True)
class Phase:
    name: str
    bytes: float = 0.0
    flops: float = 0.0
    int4_weights: float = 0.0         # int4 weights a GEMV unpacks (0 where a GEMM reads dequantized ones)
    rows: int = 1                     # rows each weight multiplies (the GEMV's M)
    kernel: Literal["mma", "dot"] = "mma"   # the int4 GEMV that runs (qwendesk_kernels/quant.py int4_linear)


@dataclass(frozen=True)
class PhaseTime:
    name: str
    read: float
    math: float
    unpack: float

    @property
    def seconds(self) -> float:
        return max(self.read, self.math) + self.unpack

    @property
    def bound(self) -> str:
        if self.unpack > max(self.read, self.math):
            return "unpack"
        return "math" if self.math > self.read else "memory"


def cycles_per_weight(p: Phase, cal: Calibration) -> float:
    if p.kernel == "dot":
        return cal.dot_row_cycles * p.rows
    tiles = [min(X_TILE, p.rows - start) for start in range(0, max(p.rows, 1), X_TILE)]
    return sum(cal.unpack_cycles + cal.unpack_row_cycles * (rows - 1) for rows in tiles)


def phase_time(p: Phase, gpu: Gpu, cal: Calibration) -> PhaseTime:
    cycles = p.int4_weights * cycles_per_weight(p, cal)
    return PhaseTime(p.name, p.bytes / (gpu.bandwidth * cal.stream), p.flops / (gpu.tensor * cal.mma),
                     cycles / (gpu.sms * gpu.clock * gpu.int_lanes / 64))


@dataclass(frozen=True)
class Step:
    """One forward step: its phases and its kernel launches (recorded from the engine's own forward)."""
    phases: tuple[Phase, ...]
    launches: int
    tokens: float = 1.0               # tokens it yields (decode: the sequences; a round: their kept tokens)
    round: bool = False               # a speculative round (pays Calibration.round_seconds)
    moe_layers: int = 0               # MoE layers it runs (each pays Calibration.moe_layer_seconds)

    def times(self, gpu: Gpu, cal: Calibration) -> list[PhaseTime]:
        return [phase_time(p, gpu, cal) for p in self.phases]

    def seconds(self, gpu: Gpu, cal: Calibration) -> float:
        return (sum(t.seconds for t in self.times(gpu, cal)) + self.launches * gpu.launch
                + (cal.round_seconds if self.round else 0.0) + self.moe_layers * cal.moe_layer_seconds)

    def tok_s(self, gpu: Gpu, cal: Calibration) -> float:
        return self.tokens / self.seconds(gpu, cal)


def total_seconds(steps: list[Step], gpu: Gpu, cal: Calibration) -> float:
    return sum(s.seconds(gpu, cal) for s in steps)


def solve(f, lo: float, hi: float, iters: int = 100) -> float:
    """The x in [lo, hi] where the increasing or decreasing function f crosses 0 (bisection; an end if it does not)."""
    flo = f(lo)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == (flo > 0):
            lo, flo = mid, f(mid)
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Measured:
    """A measured figure: the seconds `steps` took on `gpu` (docs/performance.md: `where`)."""
    label: str
    gpu: str
    steps: tuple[Step, ...]
    seconds: float
    where: str

    def predicted(self, cal: Calibration) -> float:
        return total_seconds(list(self.steps), GPUS[self.gpu], cal)

    def error(self, cal: Calibration) -> float:
        """Predicted over measured, minus 1 (+0.10: the model says 10% slower than measured)."""
        return self.predicted(cal) / self.seconds - 1


def fit(rows: dict[str, Measured], order: tuple[tuple[str, str, float, float], ...]) -> Calibration:
    """The calibration, one constant at a time: (Calibration field, the measured row it is solved on, its range)."""
    cal = Calibration()
    for name, key, lo, hi in order:
        def error(v, cal=cal, name=name, key=key):
            return rows[key].error(replace(cal, **{name: v}))
        cal = replace(cal, **{name: solve(error, lo, hi)})
    return cal

"""The consumer-GPU readiness check (engine/readiness/): it finds the engine's launches from its own code, sees the
card it is told of, fails on a config that does not fit, and the prefill attention's pruning keeps what fits.
The check needs Triton's compiler, not its interpreter (which the test session runs under): it runs in a process
of its own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from qwendesk_kernels import attention

ROOT = Path(__file__).resolve().parent.parent


def run_check_code(code: str, timeout: int = 600):
    """Run `code` (which prints one JSON line last) in a fresh process without the Triton interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


RECORD = """
import json
from engine.readiness.cards import CARDS
from engine.readiness.forward import run_all
from engine.readiness.launches import recording
out = {}
# the 3090: three forwards for the kernels they launch; the 5090: one, for the PDL it launches with
for card, forwards in ((CARDS[0], (("27b", "int4", "int8"), ("27b", "int4", "k8v4"), ("9b", "bf16", "bf16"))),
                       (CARDS[2], (("27b", "int4", "int8"),))):
    with recording(card.capability, card.sms, card.smem_per_block) as rec:
        for forward in forwards:
            run_all(rec, *forward)
    out[card.name] = dict(names=sorted({la.name for la in rec.launches}),
                          wheres=sorted({la.where.split(" KV ")[1].split(" N=")[0] for la in rec.launches}),
                          pdl=sorted({bool(la.options.get("launch_pdl")) for la in rec.launches if "PDL" in la.args}))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def recorded():
    return run_check_code(RECORD)


def test_the_launches_come_from_the_engines_forward(recorded):
    """Decode, verify and prefill kernels, ours and fla's chunked GDN, the sampler: found by running the engine."""
    found = recorded["RTX 3090"]
    for kernel in ("_gemv_mma_kernel", "_decode_split_kernel", "_prefill_kernel", "_replay_kernel", "_gemv_kernel",
                   "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o", "_int8_embedding_kernel",
                   "_select_kernel", "_decode4_split_kernel", "_prefill4_kernel", "_store_kv4_kernel"):
        assert kernel in found["names"]
    assert {"decode", "verify", "prefill 2048", "prefill 512", "prefill 3"} <= {w.split(" k=")[0]
                                                                                for w in found["wheres"]}


def test_pdl_is_off_below_sm90_and_on_at_sm120(recorded):
    """The engine's own choice per card (qwendesk_kernels/pdl.py), seen in the launches it makes."""
    assert recorded["RTX 3090"]["pdl"] == [False]
    assert True in recorded["RTX 5090"]["pdl"]


FORCED = """
import json, triton
from engine.readiness import check
from engine.readiness.cards import CARDS
from qwendesk_kernels import attention
tuner = attention._prefill_kernel
if {force}:    # the 128 x 64 tile (147,456 B at head_dim 256), the pruning bypassed
    tuner.configs = [triton.Config({{"BLOCK_M": 128, "BLOCK_N": 64}}, num_warps=8, num_stages=2)]
    tuner.early_config_prune = None
print(json.dumps(check.check(CARDS[0], ("27b",), ("int4",), {kv}, workers=1, kernels={{"_prefill_kernel"}})))
"""


def test_the_check_fails_when_a_config_over_99kb_is_forced():
    found = run_check_code(FORCED.format(force=True, kv=("bf16",)))
    assert any("shared memory 147,456 B > 101,376" in f for f in found), found
    assert any("no config of _prefill_kernel fits" in f for f in found), found


def test_the_prefill_attention_as_pruned_passes_on_a_3090():
    """What its pruning keeps on a 99 KB card compiles within 99 KB, with bf16 and int8 KV (the estimate holds)."""
    assert run_check_code(FORCED.format(force=False, kv=("int8", "bf16"))) == []


@pytest.mark.parametrize("smem, page, kv_size", [(101_376, 64, 2), (101_376, 64, 1), (232_448, 64, 2),
                                                 (101_376, 16, 2)])
def test_prefill_pruning_keeps_the_tiles_that_fit_the_card(smem, page, kv_size):
    """A 99 KB card (RTX 3090 / 4090 / 5090) keeps only tiles within it: 64 x 32 and 128 x 16 with bf16 KV, 64 x 64
    and 128 x 32 too with int8 KV; an H100 (227 KB) keeps the 128 x 64 ones too; key blocks stay inside a page."""
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in attention.PREFILL_TILES]
    kept = attention._prefill_configs_that_fit(configs, smem, D=256, PAGE=page, q_size=2, kv_size=kv_size)
    tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in kept}
    assert tiles and all(n <= page and attention.prefill_smem_bytes(m, n, 256, 2, kv_size) <= smem for m, n in tiles)
    assert ((128, 64) in tiles) == (smem > 200_000 and page >= 64)
    if page == 64:
        assert {(64, 32), (128, 16)} <= tiles
        assert ((64, 64) in tiles) == ((128, 32) in tiles) == (smem > 200_000 or kv_size == 1)


def test_prefill_estimate_is_what_triton_compiles():
    """The figures the readiness check compiled for sm_86 (Triton 3.9; head_dim 256): bf16 KV 128 x 64 at 147,456 and
    147,460 B (2 and 3 stages), 64 x 64 at 106,496, 128 x 16 at 86,016; int8 KV 128 x 64 at 115,200 and 115,204."""
    for (m, n, kv), compiled in {(128, 64, 2): 147_460, (64, 64, 2): 106_496, (128, 16, 2): 86_016,
                                 (128, 64, 1): 115_204}.items():
        assert 0 <= attention.prefill_smem_bytes(m, n, 256, 2, kv) - compiled <= 16


SPILLING_GEMV = """
import json, triton
from engine.readiness import check
from engine.readiness.cards import CARDS
from qwendesk_kernels import gemv_dot
tuner = gemv_dot.gemv_tuned
# BM = 32 with 64 weight rows per warp, the pruning bypassed: 255 registers and 208 B of stack on sm_86
tuner.configs = [triton.Config(dict(BM=32, BN=256, SPLIT_K=1), num_warps=4, num_stages=2)]
tuner.early_config_prune = None
print(json.dumps(check.check(CARDS[0], ("27b",), ("int4",), ("int8",), workers=1, kernels={"_gemv_kernel"})))
"""


def test_the_check_flags_a_gemv_config_that_spills():
    """The dot GEMV's autotuner times the configs it keeps and may pick any: one that spills is a finding."""
    found = run_check_code(SPILLING_GEMV)
    assert any("_gemv_kernel keeps 1 config(s) that spill" in f and "verify" in f for f in found), found


@pytest.mark.parametrize("cap", [(8, 6), (8, 9), (12, 0), (9, 0)])
def test_gemv_dot_pruning_keeps_what_does_not_spill_without_wgmma(cap, monkeypatch):
    """At BM = 32 a consumer card keeps tiles of 32 weight rows per warp (64 spill there), above 32 rows M tiles of
    at most 32 floats per thread in each accumulator; sm_90 keeps its own."""
    from qwendesk_kernels import gemv_dot
    monkeypatch.setattr(gemv_dot, "capability", lambda device: cap)
    monkeypatch.setattr(gemv_dot, "sm_count", lambda device: 82)
    y = torch.empty(32, 5120, device="meta")
    for bucket in (16, 32):
        kept = gemv_dot._prune_configs(gemv_dot._CONFIGS, dict(M_BUCKET=bucket, N=5120, y_ptr=y))
        tiles = {(c.kwargs["BN"], c.num_warps) for c in kept}
        assert tiles and all(c.kwargs["BM"] == bucket for c in kept)
        if bucket == 16 or cap == (9, 0):
            assert tiles == set(gemv_dot._TILES)
        else:
            assert tiles == {(32, 1), (64, 2), (128, 4)}
    kept = gemv_dot._prune_configs(gemv_dot._CONFIGS, dict(M_BUCKET=64, N=5120, y_ptr=y))   # 33-64 rows: M tiles
    tiles = {(c.kwargs["BM"], c.kwargs["BN"], c.num_warps) for c in kept}
    assert tiles == ({(64, 64, 4), (64, 128, 4), (64, 128, 8)} if cap == (9, 0) else {(64, 64, 4), (64, 128, 8)})


VISION = """
import json
from engine.readiness.forward import run_vision
from engine.readiness.launches import recording
from engine.weights.policy import QuantPolicy
out = {}
for name, policy in (("engine", None), ("int8 tower", QuantPolicy(vision="int8"))):
    with recording() as rec:
        run_vision(rec, "27b", "int4", policy)
    out[name] = sorted({(la.name, la.where) for la in rec.launches})
print(json.dumps(out))
"""


def test_the_vision_towers_launches_are_recorded():
    """The tower as the engine loads it runs on torch (16-bit linears on cuBLAS, SDPA): no Triton launch to check;
    a tower with quantized linears (not a policy the engine offers) shows that its launches would be recorded."""
    found = run_check_code(VISION)
    assert found["engine"] == []
    # (int8 weights held as two int4 planes: dequantized for the blocks' rows, the fused GEMM for the merger's 64)
    assert {name for name, _ in found["int8 tower"]} == {"_int4_dequant_kernel", "_gemv_kernel"}
    assert {where for _, where in found["int8 tower"]} == {"27b int4 vision 256x256", "27b int4 vision 512x512"}


def test_a_decode_kernel_that_keeps_any_stack_is_a_finding():
    """Every round's decode kernels keep no stack (4-bit K's verify rows of 5 drafts too, now in tiles of at most 32
    rows on the consumer cards): 8 B of it is a finding, in any round and in a decode step."""
    from types import SimpleNamespace

    from engine.readiness.cards import CARDS
    from engine.readiness.check import findings
    from engine.readiness.compile_jobs import Compiled, Job
    from engine.readiness.launches import Launch

    def finds(where: str, stack: int) -> list[str]:
        launch = Launch(fn=SimpleNamespace(__name__="_decode4_split_kernel"), args={}, options={}, where=where)
        job = Job(launch, None, "k", Compiled(stack=stack, regs=255))
        return findings({"k": job}, {}, CARDS[0])

    assert finds("27b int4 k4v4 KV verify N=8 k=5 sampled", 0) == []
    assert finds("27b int4 k4v4 KV verify N=8 k=5 sampled", 8)
    assert finds("27b int4 k4v4 KV verify N=8 k=3 sampled", 8)
    assert finds("27b int4 k4v4 KV decode N=8", 8)


def test_a_decode_attention_program_that_fills_an_sm_alone_is_a_finding():
    """Two 4-warp decode attention programs must fit a 100 KB SM (the 3090's and 4090's; the 5090 has 128 KB): 51,204 B
    each (a tile of 32 query rows with 16 KB K / V tiles) leaves one per SM; 33,796 B (8 KB tiles) two. 8-warp
    programs (64-row tiles) are held to one by their registers and are not asked to."""
    from types import SimpleNamespace

    from engine.readiness.cards import CARDS
    from engine.readiness.check import findings
    from engine.readiness.compile_jobs import Compiled, Job
    from engine.readiness.launches import Launch

    def finds(card, shared: int, warps: int = 4) -> list[str]:
        launch = Launch(fn=SimpleNamespace(__name__="_decode_split_kernel"), args={}, options={"num_warps": warps},
                        where="27b int4 bf16 KV verify N=1 k=3")
        return findings({"k": Job(launch, None, "k", Compiled(shared=shared, stack=0, regs=168))}, {}, card)

    rtx3090, rtx5090 = CARDS[0], CARDS[2]
    assert finds(rtx3090, 51_204) and finds(rtx3090, 33_796) == []
    assert finds(rtx5090, 51_204) == []
    assert finds(rtx3090, 69_636, warps=8) == []


WORKER_FAILS = """
import json, os
from engine.readiness import compile_jobs
from engine.readiness.cards import CARDS
from engine.readiness.launches import Launch

def compile_one(i):
    if i == 3:
        {fail}
    return compile_jobs.Compiled(shared=i)

compile_jobs._compile_one = compile_one      # (the forked workers inherit it)
jobs = [compile_jobs.Job(Launch(fn=None, args={{}}, options={{}}), None, f"job {{i}}") for i in range(8)]
try:
    compile_jobs.compile_all(jobs, CARDS[0], workers=2)
    print(json.dumps([j.result.shared for j in jobs]))
except RuntimeError as e:
    print(json.dumps(str(e)))
"""


@pytest.mark.parametrize("fail, reported", [("return compile_jobs.Compiled(shared=3)", list(range(8))),
                                            ("raise OSError('cuobjdump is gone')", "compiling job 3 failed in its "
                                                                                   "worker: OSError: cuobjdump"),
                                            ("os._exit(1)", "a compile worker died")])
def test_compile_workers_keep_the_jobs_order_and_report_a_failure(fail, reported):
    """Results come back in the jobs' order whichever worker compiled them; an error that is not a compile finding
    (cuobjdump failing), or a worker that dies (the compiler crashing), stops the check instead of being lost."""
    found = run_check_code(WORKER_FAILS.format(fail=fail), timeout=120)
    assert found == reported if isinstance(reported, list) else found.startswith(reported), found

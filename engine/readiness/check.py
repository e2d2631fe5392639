"""The consumer-GPU readiness check (`make check-consumer`): every Triton launch the engine makes for the 27B, 9B and
35B-A3B forwards and their vision tower, compiled for the RTX 3090 (sm_86), 4090 (sm_89) and 5090 (sm_120) by
Triton's own compiler with no GPU, and checked against what those cards can run.

For each card, the launches are recorded with the engine seeing that card (engine/readiness/launches.py: its
capability and SM count, so PDL and per-architecture choices are the card's), deduplicated (one compile per distinct
kernel, specialization and options), compiled in a fresh cache, and checked:
- it compiles;
- shared memory per block <= the card's opt-in maximum (101,376 B on all three);
- decode-path kernels (decode steps and speculative rounds) have no stack frame (spills) where cuobjdump reports it
  (up to CAPPED_STACK under a deliberate register cap); our decode-path autotuned kernels keep no config that spills
  after pruning on the card (their autotuner times the configs and may pick one), a library's needs one without;
- decode attention programs of 4 warps (one row tile of up to 32 query rows x heads) fit two to an SM's shared memory
  (1 KB per block reserved), so that a long context is not read by one program per SM;
- every autotuned kernel keeps at least one config that fits after its own pruning, and ours keep none that does not
  (fla's configs are not ours to prune: they are compiled one at a time until one fits, as its autotuner skips the
  others);
- below sm_90: no PTX uses griddepcontrol, wgmma, cp.async.bulk, setmaxnreg or fp8 types, and no launch asks for PDL.
fla-core's chunked GDN kernels (prompts over RECURRENT_MAX_TOKENS tokens) are among the launches; pyproject.toml pins
the fla-core version the check passed with, and the check refuses another one (fla sizes its tiles per card).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass

from engine.cache.kv_format import KVFormat
from engine.readiness.cards import CARDS, Card
from engine.readiness.compile_jobs import Job, compile_all, job_key
from engine.readiness.launches import Launch, recording


def fla_pin() -> str:
    """The fla-core version pyproject.toml pins (the one this check passed with)."""
    from pathlib import Path
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    pin = re.search(r'^\s*"fla-core==([\w.]+)', text, re.M)
    if pin is None:
        raise RuntimeError("pyproject.toml pins no fla-core version")
    return pin.group(1)


MODELS = ("27b", "9b", "35b-a3b")
KV = (KVFormat.INT8, KVFormat.BF16, KVFormat.K8V4, KVFormat.K4V4)   # every format, int8 first
# A kernel launched with a register cap (maxnreg: the mma GEMVs' 128, so that 16 one-warp programs stay resident per
# SM) may keep this much stack: they have 8-16 B at that cap on the H100 too, where the cap was measured faster.
CAPPED_STACK = 16
DECODE_ATTENTION = ("_decode_split_kernel", "_decode4_split_kernel")
BLOCK_RESERVED_SMEM = 1024    # shared memory the driver keeps per resident block (sm_80 and later)



def weights_for(shape: str) -> tuple[str, ...]:
    """int4, and 16-bit where the memory plan fits those weights on a 24 GiB card (the 9B; not the 27B's 54 GB)."""
    from engine.model.config import parse_model_config
    from engine.core.device import DeviceInfo
    from engine.core.memory import GIB, plan_for
    from engine.core.params import EngineConfig
    from engine.bench.random_model import text_config
    card = DeviceInfo("cuda", "24 GiB card", 24 * GIB, int(23.5 * GIB))
    bf16 = plan_for(EngineConfig(model="", weights="bf16"), card, model=parse_model_config(text_config(shape)))
    return ("int4", "bf16") if bf16.fits else ("int4",)


def record(card: Card, models=MODELS, weights=None, kv=KV) -> list[Launch]:
    """Every launch of the forwards of `models` x `weights` (default: weights_for each) x `kv`, as the engine makes
    them on `card`."""
    from engine.readiness.forward import run_all, run_drafter, run_vision
    with recording(card.capability, card.sms, card.smem_per_block, card.smem_per_sm) as rec:
        for shape in models:
            for w in weights or weights_for(shape):
                for fmt in kv:
                    run_all(rec, shape, w, fmt)
                    run_drafter(rec, shape, w, fmt)
            run_vision(rec, shape, (weights or weights_for(shape))[0])   # (the tower's linears: 16-bit either way)
        for launch in rec.launches:
            if launch.autotuner is not None:
                launch.configs = kept_configs(launch)    # (pruning sees the card too)
    return rec.launches


def kept_configs(launch: Launch) -> list:
    """The configs the kernel's autotuner keeps for this launch after its own pruning."""
    tuner = launch.autotuner
    assert tuner is not None
    tuner.nargs = {} if tuner.perf_model else launch.args      # (its perf model takes nargs and kwargs together)
    try:
        return tuner.prune_configs(dict(launch.args, **launch.options))
    finally:
        tuner.nargs = None


def is_decode(launch: Launch) -> bool:
    return " decode " in launch.where or " verify " in launch.where


def ours(launch: Launch) -> bool:
    """One of our kernels (not fla's)."""
    return launch.fn.fn.__module__.startswith("qwendesk_kernels.")


@dataclass
class Tuned:
    """An autotuned launch: the jobs of its configs compiled so far; a library's kernel (fla's: its configs are not
    ours to prune) is compiled one config at a time until one fits, as its autotuner skips those that do not."""
    launch: Launch
    keys: list[str]
    pending: list


def _add_job(jobs: dict, launch: Launch, config, card: Card) -> str:
    key, _ = job_key(launch, config, card)
    job = jobs.setdefault(key, Job(launch, config, key))
    if is_decode(launch):
        job.launch = launch                   # (a decode-path launch decides whether spills count)
    return key


def jobs_for(launches: list[Launch], card: Card) -> tuple[dict[str, Job], dict[str, Tuned]]:
    """The distinct compiles of `launches` on `card` (by key), and the autotuned launches (by kernel and configs)."""
    jobs: dict[str, Job] = {}
    tuned: dict[str, Tuned] = {}
    for launch in launches:
        if launch.autotuner is None:
            _add_job(jobs, launch, None, card)
            continue
        first = launch.configs if ours(launch) else launch.configs[:1]
        keys = [_add_job(jobs, launch, config, card) for config in first]
        tkey = f"{launch.name} {[job_key(launch, c, card)[1] for c in launch.configs]}"
        if tkey not in tuned or is_decode(launch):
            tuned[tkey] = Tuned(launch, keys, [] if ours(launch) else launch.configs[1:])
    return jobs, tuned


def _fits(job: Job, card: Card) -> bool:
    return not job.compiled.error and job.compiled.shared <= card.smem_per_block


def more_jobs(jobs: dict[str, Job], tuned: dict[str, Tuned], card: Card) -> list[Job]:
    """The next config of each library kernel none of whose compiled configs fits yet."""
    new = []
    for t in tuned.values():
        if t.pending and not any(_fits(jobs[k], card) for k in t.keys):
            key = _add_job(jobs, t.launch, t.pending.pop(0), card)
            t.keys.append(key)
            if jobs[key].result is None:
                new.append(jobs[key])
    return list({id(j): j for j in new}.values())


def findings(jobs: dict[str, Job], tuned: dict[str, Tuned], card: Card) -> list[str]:
    """What does not hold on `card` (empty: ready)."""
    bad = []
    below90 = card.capability < (9, 0)
    tuned_keys = {k for t in tuned.values() for k in t.keys}
    for job in jobs.values():
        r, where = job.compiled, f"{job.launch.name} ({job.launch.where}{_config_text(job.config)})"
        if job.key in tuned_keys and not ours(job.launch):
            continue                          # a library's config: its autotuner skips it if it does not fit
        if r.error:
            bad.append(f"does not compile: {where}: {r.error}")
            continue
        if r.shared > card.smem_per_block:
            bad.append(f"shared memory {r.shared:,} B > {card.smem_per_block:,}: {where}")
        if below90 and r.forbidden:
            bad.append(f"PTX uses {', '.join(r.forbidden)} below sm_90: {where}")
        if below90 and (r.launch_pdl or job.launch.options.get("launch_pdl") or job.launch.args.get("PDL")):
            bad.append(f"PDL on below sm_90: {where}")
        if job.launch.name in DECODE_ATTENTION and job.launch.options.get("num_warps") == 4 \
                and 2 * (r.shared + BLOCK_RESERVED_SMEM) > card.smem_per_sm:
            bad.append(f"one decode attention program per SM ({r.shared:,} B of {card.smem_per_sm:,}): {where}")
        allowed = CAPPED_STACK if job.launch.options.get("maxnreg") else 0
        if is_decode(job.launch) and job.key not in tuned_keys and (r.stack or 0) > allowed:
            bad.append(f"decode-path kernel spills ({r.stack} B of stack, {r.regs} registers): {where}")
    for t in tuned.values():
        fits = [k for k in t.keys if _fits(jobs[k], card)]
        if not fits:
            bad.append(f"no config of {t.launch.name} fits after pruning ({t.launch.where})")
        elif ours(t.launch) and len(fits) < len(t.keys):
            bad.append(f"{t.launch.name} keeps {len(t.keys) - len(fits)} config(s) that do not fit ({t.launch.where})")
        spills = [k for k in fits if jobs[k].compiled.stack]
        if is_decode(t.launch) and spills and ours(t.launch):      # (its autotuner times them, it may pick one)
            r = jobs[spills[0]].compiled
            bad.append(f"{t.launch.name} keeps {len(spills)} config(s) that spill (e.g. {r.stack} B of stack, {r.regs} "
                       f"registers{_config_text(jobs[spills[0]].config)}) ({t.launch.where})")
        elif is_decode(t.launch) and fits and len(spills) == len(fits):
            bad.append(f"every config of {t.launch.name} spills ({t.launch.where})")
    return bad


def _config_text(config) -> str:
    if config is None:
        return ""
    return f"; {config.kwargs} warps={config.num_warps} stages={config.num_stages}"


def check(card: Card, models=MODELS, weights=None, kv=KV, workers: int | None = None, kernels=None,
          log=print) -> list[str]:
    """Record, compile and check one card (only the kernels named in `kernels`, if given); returns the findings."""
    t0 = time.monotonic()
    launches = [la for la in record(card, models, weights, kv) if kernels is None or la.name in kernels]
    jobs, tuned = jobs_for(launches, card)
    todo = list(jobs.values())
    while todo:
        compile_all(todo, card, workers or os.cpu_count() or 1)
        todo = more_jobs(jobs, tuned, card)
    seconds = sum(j.compiled.seconds for j in jobs.values())
    log(f"{card.name} (sm_{card.capability[0]}{card.capability[1]}): {len(launches)} launches, {len(jobs)} distinct "
        f"compiles ({seconds:.0f} s of compiling), {len(tuned)} autotuned launch shapes", flush=True)
    bad = findings(jobs, tuned, card)
    done = [j for j in jobs.values() if not j.compiled.error]
    worst = max(done, key=lambda j: j.compiled.shared, default=None)
    if worst is not None:
        log(f"  largest shared memory: {worst.compiled.shared:,} B ({worst.launch.name}{_config_text(worst.config)})")
    per_kernel: dict[str, list[float]] = {}
    for j in jobs.values():
        per_kernel.setdefault(j.launch.name, []).append(j.compiled.seconds)
    slowest = sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))[:5]
    log("  most compile time: " + ", ".join(f"{name} {sum(t):.0f} s ({len(t)})" for name, t in slowest))
    log(f"  {len(bad)} finding(s), {time.monotonic() - t0:.0f} s", flush=True)
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check-consumer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cards", nargs="*", default=[c.name for c in CARDS], help="cards to check (default: all)")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--kernels", nargs="*", default=None, help="only these kernels (function names)")
    ap.add_argument("--workers", type=int, default=None, help="compile processes (default: one per core)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    failed = False
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        # nothing from an earlier run: every kernel is compiled here (unless a TRITON_CACHE_DIR is set: development)
        os.environ.setdefault("TRITON_CACHE_DIR", cache)
        for card in CARDS:
            if card.name not in args.cards:
                continue
            for line in check(card, tuple(args.models), workers=args.workers, kernels=args.kernels):
                print(f"  {card.name}: {line}")
                failed = True
    import fla
    if fla.__version__ != fla_pin():
        print(f"fla-core {fla.__version__} is installed; pyproject.toml pins {fla_pin()}, the version this check "
              f"passed with: move the pin once this passes with {fla.__version__}")
        failed = True
    print("FAILED" if failed else "consumer GPUs ready (compile-checked, nothing launched)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

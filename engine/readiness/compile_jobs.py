"""A distinct compile of a recorded launch for a card (`Job`), and what it gave (`Compiled`): each launch bound as
JITFunction.run would bind it on that card, then compiled by Triton's own compiler with no GPU, in forked workers
(engine/readiness/check.py decides which jobs there are and what their results mean)."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from engine.readiness.cards import Card
from engine.readiness.launches import Launch

BELOW_SM90_PTX = re.compile(r"griddepcontrol|wgmma|cp\.async\.bulk|setmaxnreg|\.e4m3|\.e5m2")


@dataclass
class Compiled:
    """One compile: the facts the check needs (the compiled kernel itself stays in the worker)."""
    shared: int = 0
    stack: int | None = None  # bytes of stack frame (spills); None: not known
    regs: int | None = None
    forbidden: list[str] = field(default_factory=list)   # PTX instructions a card below sm_90 lacks
    launch_pdl: bool = False
    error: str = ""
    seconds: float = 0.0


@dataclass
class Job:
    """A distinct compile: a launch (with one config of its autotuner) for one card."""
    launch: Launch
    config: object | None     # triton.Config, for an autotuned kernel
    key: str
    result: Compiled | None = None

    @property
    def compiled(self) -> Compiled:
        """Its compile's result (check compiles every job before it reads one)."""
        assert self.result is not None, f"{self.key} was not compiled"
        return self.result


def _target(card: Card):
    from triton.backends.compiler import GPUTarget
    major, minor = card.capability
    return GPUTarget("cuda", major * 10 + minor, 32)


def _bind(launch: Launch, config, card: Card):
    """(ASTSource, options, specialization) of a launch for `card`, as JITFunction.run would make them there."""
    from triton.compiler import ASTSource
    fn = launch.fn
    kwargs = _kwargs(launch, config)
    backend, binder = _binder(fn, card)
    bound, specialization, extra = binder(**kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, dict(kwargs, debug=False), bound, specialization,
                                                          extra)
    return ASTSource(fn, signature, constexprs, attrs), options, str(specialization)


def _kwargs(launch: Launch, config) -> dict:
    kwargs = dict(launch.args, **launch.options)
    if config is not None:
        kwargs.update(config.all_kwargs())
    return kwargs


_BINDERS: dict = {}


def _binder(fn, card: Card):
    """(backend, argument binder) of `fn` for `card`: made once each, as JITFunction keeps them per device (making
    a binder execs generated code)."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    key = (id(fn), card.capability)
    if key not in _BINDERS:
        backend = make_backend(_target(card))
        _BINDERS[key] = backend, create_function_from_signature(fn.signature, fn.params, backend)
    return _BINDERS[key]


_KEYS: dict = {}


def job_key(launch: Launch, config, card: Card) -> tuple[str, str]:
    """(compile key, specialization) of a launch with `config` on `card`: what a compile depends on. The same for
    launches with equal arguments, options and config (a tensor counts by its dtype and address, all the binder
    reads of it), so those bind once."""
    kwargs = _kwargs(launch, config)
    args = tuple((k, _arg_identity(v)) for k, v in kwargs.items())
    memo = (id(launch.fn), card.capability, args) if all(a is not None for _, a in args) else None
    if memo is None or memo not in _KEYS:
        _, options, spec = _bind(launch, config, card)
        found = f"{launch.fn.fn.__module__}.{launch.name} {spec} {options}", spec
        if memo is None:
            return found
        _KEYS[memo] = found
    return _KEYS[memo]


def _arg_identity(value):
    """What binding reads of an argument, hashable (None: not a kind this knows; that launch is bound every time)."""
    import torch
    if isinstance(value, torch.Tensor):
        return "tensor", value.dtype, value.data_ptr()
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return type(value), value
    return None


_JOBS: list[Job] = []
_CARD: Card | None = None


def _compile_one(i: int) -> Compiled:
    import triton
    job, card = _JOBS[i], _CARD
    assert card is not None                 # compile_all sets it before the workers start
    out = Compiled()
    t0 = time.monotonic()
    try:
        src, options, _ = _bind(job.launch, job.config, card)
        kernel = triton.compile(src, target=_target(card), options=options.__dict__)
    except Exception as e:               # noqa: BLE001  (any compile failure is a finding)
        out.error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300]
        return out
    out.shared = kernel.metadata.shared
    out.launch_pdl = bool(getattr(kernel.metadata, "launch_pdl", False))
    if card.capability < (9, 0):
        out.forbidden = sorted(set(BELOW_SM90_PTX.findall(kernel.asm["ptx"])))
    out.regs, out.stack = resource_usage(kernel.asm["cubin"])
    out.seconds = time.monotonic() - t0
    return out


def resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers, stack frame bytes) of a cubin's kernel, from cuobjdump -res-usage (None where it is missing)."""
    import triton.backends.nvidia
    tool = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", text), re.search(r"STACK:(\d+)", text)
    return (int(regs.group(1)) if regs else None), (int(stack.group(1)) if stack else None)


def compile_all(jobs: list[Job], card: Card, workers: int) -> None:
    """Compile every job for `card`, in `workers` forked processes (each inherits the jobs; a job is compiled once,
    in a fresh cache). A compile that fails is a finding (Compiled.error); anything else that goes wrong in a worker,
    a worker that dies included, stops the check with the job it was on."""
    global _JOBS, _CARD
    _JOBS, _CARD = jobs, card
    if workers <= 1:
        results = [_compile_one(i) for i in range(len(jobs))]
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_compile_one, i) for i in range(len(jobs))]
            results = [_result(future, job) for future, job in zip(futures, jobs)]
    for job, res in zip(jobs, results):
        job.result = res


def _result(future, job: Job) -> Compiled:
    try:
        return future.result()
    except BrokenProcessPool as e:
        raise RuntimeError(f"a compile worker died (the compiler crashed or was killed); unfinished: {job.key}") from e
    except Exception as e:
        raise RuntimeError(f"compiling {job.key} failed in its worker: {type(e).__name__}: {e}") from e

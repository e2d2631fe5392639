"""Every Triton launch the engine makes for a forward, found by running the engine's own code with no GPU.

The model is built on the `meta` device (shapes, no memory) and every tensor counts as a CUDA one, so each op
takes its Triton path; a launch is recorded (the kernel, its bound arguments, its launch options) instead of
run, and its outputs stay meta. The recorded launches are what the readiness check compiles (engine/readiness/
check.py): the list follows the engine's code, never a hand-kept one. Kernels behind an autotuner are recorded
with the autotuner, so the check compiles every config it keeps after pruning.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction


@dataclass
class Launch:
    """One kernel launch: the function, its arguments by name and the keyword options (num_warps, ...)."""
    fn: JITFunction
    args: dict
    options: dict
    autotuner: Autotuner | None = None       # the kernel's autotuner, where it has one
    configs: list = field(default_factory=list)   # those its autotuner keeps after pruning on the card (check.record)
    where: str = ""                          # what the engine was running (e.g. "27b int4 decode N=4")

    @property
    def name(self) -> str:
        return self.fn.__name__


@dataclass
class Recorder:
    launches: list[Launch] = field(default_factory=list)
    where: str = ""

    def jit_run(self, fn: JITFunction, args, kwargs) -> None:
        named = dict(zip(fn.arg_names, args))
        options = {k: v for k, v in kwargs.items() if k not in fn.arg_names}
        named.update({k: v for k, v in kwargs.items() if k in fn.arg_names})
        self.launches.append(Launch(fn, named, options, where=self.where))

    def autotuner_run(self, tuner: Autotuner, args, kwargs) -> None:
        fn = tuner.fn
        while not isinstance(fn, JITFunction):      # (an autotuner around heuristics: the jit function inside)
            fn = fn.fn
        named = dict(zip(tuner.arg_names, args))
        named.update({k: v for k, v in kwargs.items() if k in tuner.arg_names})
        options = {k: v for k, v in kwargs.items() if k not in tuner.arg_names and k not in ("grid", "warmup")}
        self.launches.append(Launch(fn, named, options, autotuner=tuner, where=self.where))


def _is_cuda(self) -> bool:
    return self.device.type in ("cuda", "meta")


@contextlib.contextmanager
def recording(capability: tuple[int, int] = (8, 6), sms: int = 82, smem: int = 101_376, smem_sm: int = 102_400):
    """Within: meta tensors count as CUDA ones, a device has `capability`, `sms` SMs, `smem` bytes of shared
    memory per block and `smem_sm` per SM, and Triton launches are recorded (yielded Recorder), not run."""
    from qwendesk_kernels import gemv_mma, pdl
    rec = Recorder()
    saved = [(torch.Tensor, "is_cuda"), (JITFunction, "run"), (Autotuner, "run"), (torch.cuda, "get_device_capability"),
             (gemv_mma, "_capability"), (pdl, "supported")]
    old = [(obj, name, obj.__dict__.get(name, getattr(obj, name))) for obj, name in saved]
    fakes = {"sm_count": lambda device: sms, "smem_per_block": lambda device: smem,
             "smem_per_sm": lambda device: smem_sm, "capability": lambda device: capability}
    for mod in _kernel_modules():
        for name, fake in fakes.items():
            if name in vars(mod):
                old.append((mod, name, vars(mod)[name]))
                setattr(mod, name, fake)
    torch.Tensor.is_cuda = property(_is_cuda)
    JITFunction.run = lambda self, *args, grid=None, warmup=False, **kw: rec.jit_run(self, args, kw)
    Autotuner.run = lambda self, *args, **kw: rec.autotuner_run(self, args, kw)
    torch.cuda.get_device_capability = lambda device=None: capability
    # patched functions (restored below): their stubs' types are the cached / real functions'
    gemv_mma._capability = lambda device: capability  # type: ignore[assignment]
    pdl.supported = lambda device: pdl.capable(capability)  # type: ignore[assignment]  # (a meta device is no CUDA one)
    try:
        yield rec
    finally:
        for obj, name, value in old:
            if obj is torch.Tensor and name == "is_cuda":
                del torch.Tensor.is_cuda               # (torch.Tensor's own comes from its C base)
            else:
                setattr(obj, name, value)


def _kernel_modules():
    """Every kernel module (imported now: a name bound at import must be replaced before anyone calls it)."""
    import importlib
    import pkgutil

    import qwendesk_kernels
    names = [m.name for m in pkgutil.iter_modules(qwendesk_kernels.__path__) if not m.name.startswith("bench")]
    return [importlib.import_module(f"qwendesk_kernels.{name}") for name in names]

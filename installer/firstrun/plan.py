"""Which PyTorch build this machine gets, and what installing it means: the packages pinned in
installer/firstrun/pins.py, where they come from (the PyTorch index for that build, or a local wheel folder),
and where they go.

The GPU builds need a driver at least as new as their CUDA release (NVIDIA's CUDA toolkit release notes,
"CUDA Toolkit and Corresponding Driver Versions") and a card whose architecture the build was compiled for
(PyTorch's release build matrix, TORCH_CUDA_ARCH_LIST per CUDA release: CUDA 13 dropped Maxwell, Pascal and Volta,
PyTorch's CUDA 12.8 builds start at Turing too; `torch.cuda.get_arch_list()` tells on a machine with the build).
A GTX 1080 Ti (sm_61) with driver 580 gets CUDA 12.6, not 13.0. An older driver, a card no build has, or no
NVIDIA GPU gets the CPU build and a message that says why and what that means. Which builds exist changes with
each PyTorch release: `make check-plans` checks them against https://download.pytorch.org/whl/ where it reaches it.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from installer.firstrun import pins
from installer.firstrun.gpu import NvidiaGpu

PYTORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
PYPI_INDEX = "https://pypi.org/simple"
MIB = 1 << 20


@dataclass(frozen=True)
class Variant:
    name: str                        # the PyTorch index's name for the build: cu130, cu128, cu126, cpu
    label: str
    min_driver: dict                 # sys.platform -> the oldest driver the build runs on
    download_gb: float               # about how much is downloaded (CPU: measured on Linux; GPU: an estimate)
    installed_gb: float              # about how much it takes installed (the free-space check counts it)
    archs: tuple = ((0, 0), (0, 0))  # the oldest and newest compute capability compiled in

    def has_arch(self, gpu: NvidiaGpu) -> bool:
        """Compiled for this card: within the build's range (a newer minor of the newest major runs its code);
        a card whose capability nvidia-smi cannot tell is taken to be covered."""
        oldest, newest = self.archs
        return gpu.compute_cap is None or oldest <= gpu.compute_cap and gpu.compute_cap[0] <= newest[0]

    def runs_on(self, gpu: NvidiaGpu, platform: str) -> bool:
        return gpu.driver >= self.min_driver[platform] and self.has_arch(gpu)


GPU_VARIANTS = (     # best first
    Variant("cu130", "CUDA 13.0", {"linux": (580, 65, 6), "win32": (580, 88)}, 3.5, 4.7, ((7, 5), (12, 1))),
    Variant("cu128", "CUDA 12.8", {"linux": (570, 26), "win32": (570, 65)}, 3.5, 4.7, ((7, 5), (12, 0))),
    Variant("cu126", "CUDA 12.6", {"linux": (560, 28, 3), "win32": (560, 76)}, 3.5, 4.7, ((5, 0), (9, 0))),
)
CPU = Variant("cpu", "CPU", {}, 0.5, 1.8)
CPU_MEANS = ("Models then run on the processor: expect a few tokens per second at best, which is fine for the "
             "smallest models only.")


@dataclass(frozen=True)
class Choice:
    variant: Variant
    gpu: NvidiaGpu | None
    platform: str

    def message(self, wheels: Path | None = None) -> str:
        """What this machine gets and why; where it comes from: about how much to download, or `wheels`."""
        size = (f"from the folder of wheels {wheels}" if wheels else
                f"about {self.variant.download_gb:.1f} GB to download")
        if self.variant is not CPU:
            return (f"Found {self.gpu.name} ({self.gpu.memory_mib / 1024:.0f} GB, driver {self.gpu.driver_text}). "
                    f"Qwen Desk installs its GPU engine (PyTorch for {self.variant.label}, {size}) "
                    f"once, into your user folder.")
        builds = [v for v in GPU_VARIANTS if self.gpu is not None and v.has_arch(self.gpu)]
        if self.gpu is None:
            why = "No NVIDIA GPU was found, so Qwen Desk installs its CPU engine"
        elif not builds:
            cap = ".".join(map(str, self.gpu.compute_cap))
            why = (f"Your {self.gpu.name} (compute capability {cap}) is older than any GPU engine supports, so "
                   f"Qwen Desk installs its CPU engine")
        else:
            oldest = min(v.min_driver[self.platform] for v in builds)
            why = (f"Your NVIDIA driver ({self.gpu.driver_text}) is older than the "
                   f"{'.'.join(map(str, oldest))} that the GPU engine needs. Update the driver and start Qwen Desk "
                   f"again to get the GPU engine; until then it installs its CPU engine")
        return f"{why} ({size}). {CPU_MEANS}"


def choose(gpus: list[NvidiaGpu], platform: str = sys.platform, forced: str = "") -> Choice:
    """The best build the first GPU runs (its driver and its architecture); `forced` (QWENDESK_RUNTIME_VARIANT) names
    one outright."""
    gpu = gpus[0] if gpus else None
    if forced:
        variant = {v.name: v for v in (*GPU_VARIANTS, CPU)}.get(forced)
        if variant is None:
            raise ValueError(f"QWENDESK_RUNTIME_VARIANT={forced!r} is not one of "
                             f"{', '.join(v.name for v in (*GPU_VARIANTS, CPU))}")
        return Choice(variant, gpu, platform)
    if gpu is not None:
        for variant in GPU_VARIANTS:
            if variant.runs_on(gpu, platform):
                return Choice(variant, gpu, platform)
    return Choice(CPU, gpu, platform)


def has_c_compiler() -> bool:
    """Triton's own search on Linux: $CC, else gcc or clang on PATH."""
    return bool(os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang"))


@dataclass(frozen=True)
class RuntimePlan:
    choice: Choice
    root: Path                       # <user data>/runtime
    wheels: Path | None = None       # a local wheel folder: install from it, offline
    with_compiler: bool = False
    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"    # the interpreter the runtime serves
    indexes: tuple[str, ...] = ()    # package indexes other than the defaults (the tests' local one)

    @property
    def key(self) -> str:
        """'2.13.0-cu130-py312': short, as the Windows path limit wants (firstrun/unpack.py)."""
        return f"{pins.TORCH}-{self.choice.variant.name}-py{self.python.replace('.', '')}"

    @property
    def target(self) -> Path:
        """The finished runtime: a folder that goes on sys.path."""
        return self.root / self.key

    @property
    def staging(self) -> Path:
        """Where the runtime is unpacked before it is complete (shorter than any target)."""
        return self.root / "new"

    @property
    def download_dir(self) -> Path:
        """Downloaded wheels, kept until the install succeeds: a retry downloads only what is missing."""
        return self.root / "wheels"

    @property
    def requirements(self) -> list[str]:
        packages = dict(pins.PACKAGES[self.choice.platform])
        if self.with_compiler:
            packages.update([pins.COMPILER])
        return [f"torch=={pins.TORCH}+{self.choice.variant.name}",
                *(f"{name}=={version}" for name, version in packages.items())]

    @property
    def index_urls(self) -> tuple[str, ...]:
        """The build's PyTorch index, then PyPI (the packages that index lacks); `indexes` stands in for both."""
        return self.indexes or (PYTORCH_INDEX.format(variant=self.choice.variant.name), PYPI_INDEX)

    @property
    def download_command(self) -> str:
        """How to fill a folder of wheels for this plan on a machine with network (same system, same Python)."""
        return " ".join(["pip download --only-binary=:all: -d qwendesk-wheels", *self.index_args, *self.requirements])

    @property
    def index_args(self) -> list[str]:
        first, *others = self.index_urls
        return ["--index-url", first, *(arg for url in others for arg in ("--extra-index-url", url))]


def runtime_root() -> Path:
    """QWENDESK_RUNTIME_DIR, else runtime/ in the app's data folder (r/ on Windows: its 260-character paths)."""
    from app.paths import data_dir

    override = os.environ.get("QWENDESK_RUNTIME_DIR")
    return Path(override) if override else data_dir() / ("r" if sys.platform == "win32" else "runtime")


def make_plan(gpus: list[NvidiaGpu], platform: str = sys.platform) -> RuntimePlan:
    """This machine's plan, from its GPUs and the environment: QWENDESK_WHEELS (a local wheel folder: the offline
    path), QWENDESK_RUNTIME_VARIANT (force a build), QWENDESK_RUNTIME_DIR (where runtimes live)."""
    wheels = os.environ.get("QWENDESK_WHEELS")
    choice = choose(gpus, platform, os.environ.get("QWENDESK_RUNTIME_VARIANT", ""))
    return RuntimePlan(choice, runtime_root(), Path(wheels) if wheels else None,
                       with_compiler=platform == "linux" and not has_c_compiler())


if __name__ == "__main__":
    # `python -m installer.firstrun.plan VARIANT`: the requirements of that build for this platform, one a line
    # (the Makefile fills a local wheel folder with them; the release workflow checks the index has them)
    forced = choose([], sys.platform, sys.argv[1] if len(sys.argv) > 1 else "cpu")
    print("\n".join(RuntimePlan(forced, Path(".")).requirements))

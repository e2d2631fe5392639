"""Install a RuntimePlan with pip, reporting progress as it goes.

Two steps. Download: `pip download` of the pinned packages into the runtime's wheels/ folder (a wheel that
finished downloading before a failure or a closed window is not fetched again; pip resumes a broken transfer
within a run, --resume-retries). Install: `pip install --no-index` from that folder (or from the user's local
wheel folder, the offline path, which skips the download) into <key>.partial, renamed to <key> once complete,
so a half-done install is never used. pip is the app's own: in the frozen app the executable runs pip when
its first argument is --pip (installer/launcher.py); elsewhere `python -m pip`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from installer.firstrun.plan import CPU, GPU_VARIANTS, RuntimePlan

MARKER = "qwendesk-runtime.json"
PROGRESS = re.compile(r"Progress (\d+) of (\d+)")
DOWNLOADING = re.compile(r"Downloading (\S+?)(?: \((.+)\))?$")


@dataclass
class Progress:
    step: str                 # Downloading | Installing | Done
    detail: str = ""          # the file on its way, or pip's last line
    done: int = 0             # bytes of the current file (0 / 0: no measure)
    total: int = 0
    files: int = 0            # files downloaded (or found already downloaded) so far


class InstallError(RuntimeError):
    pass


def pip_command() -> list[str]:
    return [sys.executable, "--pip"] if getattr(sys, "frozen", False) else [sys.executable, "-m", "pip"]


def pip_env() -> dict:
    """pip with no configuration of the user's (files or PIP_* variables: they could point anywhere) and no
    questions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    return dict(env, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
                PYTHONUNBUFFERED="1")


def is_complete(target: Path) -> bool:
    return (target / MARKER).is_file()


def kept_gpu_runtime(plan: RuntimePlan) -> Path | None:
    """A GPU runtime of the same versions installed earlier, when this launch's check chose the CPU: a GPU check
    that failed once (a driver mid-update) must not replace a working GPU engine with the CPU one."""
    if plan.choice.variant is not CPU:
        return None
    for variant in GPU_VARIANTS:
        other = dataclasses.replace(plan, choice=dataclasses.replace(plan.choice, variant=variant))
        if is_complete(other.target):
            return other.target
    return None


def read_progress(line: str, progress: Progress) -> bool:
    """Fold one line of pip's output into `progress`; True when it changed what to show."""
    line = line.strip()
    if m := PROGRESS.fullmatch(line):
        progress.done, progress.total = int(m.group(1)), int(m.group(2))
        return True
    if m := DOWNLOADING.match(line):
        progress.detail = m.group(1).rsplit("/", 1)[-1]
        progress.done = progress.total = 0
        return True
    if line.startswith(("Saved ", "File was already downloaded")):
        progress.files += 1
        return True
    if line.startswith("Installing collected packages"):
        progress.step, progress.detail, progress.done, progress.total = "Installing", line, 0, 0
        return True
    return False


class Installer:
    """Runs the plan's steps; `on_progress(Progress)` is called from the thread that calls run()."""

    def __init__(self, plan: RuntimePlan, on_progress=lambda progress: None):
        self.plan = plan
        self.on_progress = on_progress
        self._process: subprocess.Popen | None = None
        self._cancelled = False

    def run(self) -> Path:
        """Install the plan; the runtime's folder, complete. InstallError says what went wrong."""
        plan = self.plan
        if is_complete(plan.target):
            return plan.target
        plan.root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        wheels = plan.wheels
        if wheels is None:
            plan.download_dir.mkdir(exist_ok=True)
            self._pip(Progress("Downloading"), ["download", "--only-binary=:all:", "--dest", str(plan.download_dir),
                                                "--find-links", str(plan.download_dir), *plan.index_args])
            wheels = plan.download_dir
        elif not wheels.is_dir():
            raise InstallError(f"The wheel folder {wheels} does not exist.")
        shutil.rmtree(plan.staging, ignore_errors=True)
        self._pip(Progress("Installing"), ["install", "--no-index", "--find-links", str(wheels), "--only-binary=:all:",
                                           "--no-compile", "--target", str(plan.staging)])
        self._finish(time.monotonic() - started)
        self.on_progress(Progress("Done", str(plan.target)))
        return plan.target

    def cancel(self) -> None:
        self._cancelled = True
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def _pip(self, progress: Progress, args: list[str]) -> None:
        command = [*pip_command(), args[0], "--progress-bar", "raw", "--resume-retries", "5", *args[1:],
                   *self.plan.requirements]
        flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) if sys.platform == "win32" else 0
        self.on_progress(progress)
        tail: list[str] = []
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         errors="replace", env=pip_env(), creationflags=flags)
        for line in self._process.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            if read_progress(line, progress):
                self.on_progress(progress)
        code = self._process.wait()
        if self._cancelled:
            raise InstallError("Cancelled.")
        if code != 0:
            errors = [t for t in tail if t.startswith("ERROR")] or tail[-3:]
            raise InstallError(f"pip {args[0]} failed (exit code {code}): " + " ".join(errors))

    def _finish(self, seconds: float) -> None:
        """Mark the staged runtime complete, then make it the runtime; older runtimes and downloads go."""
        plan = self.plan
        if plan.with_compiler:
            write_cc_wrapper(plan.staging)
        (plan.staging / MARKER).write_text(json.dumps({
            "variant": plan.choice.variant.name, "requirements": plan.requirements, "seconds": round(seconds, 1),
            "source": str(plan.wheels) if plan.wheels else plan.index_args[1]}, indent=1), encoding="utf-8")
        shutil.rmtree(plan.target, ignore_errors=True)
        plan.staging.rename(plan.target)
        for other in plan.root.iterdir():
            if other != plan.target and other.is_dir():
                shutil.rmtree(other, ignore_errors=True)


def cc_wrapper(runtime: Path) -> Path:
    return runtime / "bin" / "cc"


def write_cc_wrapper(runtime: Path) -> None:
    """A `cc` that runs zig's C compiler (the ziglang wheel ships zig and its libc headers)."""
    wrapper = cc_wrapper(runtime)
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text('#!/bin/sh\nexec "$(dirname "$0")/../ziglang/zig" cc "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)

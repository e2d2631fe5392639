"""Install a RuntimePlan, reporting progress as it goes.

Three steps. Resolve: pip's resolver, dry-run, says which wheels the pinned packages need (URLs and SHA-256s;
first the index is asked whether it answers at all: no network is said as such, at once). Download: the app
fetches them itself into the runtime's wheels/ folder (firstrun/download.py: a file cut off by a failure, Try
again or a restart goes on where it stopped; each checked against its SHA-256), after checking the free space.
Install: exactly those files (or, the offline path, the wheels pip's resolver picks from the user's folder of
wheels) unpacked into the staging folder (firstrun/unpack.py: pip's --target would pass Windows' path limit),
renamed to <key> once complete (retried while an antivirus holds the new files), so a half-done install is never
used. pip is the app's own: in the frozen app the executable runs pip when its first argument is --pip
(installer/launcher.py); elsewhere `python -m pip`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from installer.firstrun.download import DownloadError, fetch, reachable, wheels_of, with_size
from installer.firstrun.plan import CPU, GPU_VARIANTS, RuntimePlan
from installer.firstrun.unpack import BadWheel, unpack_all

MARKER = "qwendesk-runtime.json"
GB = 1e9
RENAME_TRIES, RENAME_WAIT_S = 40, 0.25      # up to 10 s while another process (an antivirus scan) holds a file


@dataclass
class Progress:
    step: str                 # Resolving | Downloading | Installing | Done
    detail: str = ""          # the file on its way
    done: int = 0             # bytes so far of `total`, downloaded or unpacked (0 / 0: no measure)
    total: int = 0
    files: int = 0            # files downloaded (or found already downloaded) so far
    count: int = 0            # files to download or unpack in all


class InstallError(RuntimeError):
    pass


class NoNetwork(InstallError):
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


def remove_runtimes(root: Path) -> None:
    """What the first launch put in `root`: runtimes, a half-done one, the downloads; `root` too once empty. Nothing
    else (QWENDESK_RUNTIME_DIR may name a folder that holds other files). OSError while a file is in use."""
    if not root.is_dir():
        return
    for child in root.iterdir():
        if is_complete(child) or child.name in ("new", "wheels", "resolved.json"):
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    if not any(root.iterdir()):
        root.rmdir()


def check_space(folder: Path, download: int, installed: int) -> None:
    free = shutil.disk_usage(folder).free
    need = download + installed
    if free < need:
        raise InstallError(f"Not enough free disk space in {folder}: {need / GB:.1f} GB needed ({download / GB:.1f} "
                           f"to download, about {installed / GB:.1f} installed), {free / GB:.1f} GB free. Free some "
                           f"space and Try again.")


def rename_with_retry(source: Path, target: Path) -> None:
    """os.rename, tried again for a while: on Windows an antivirus scanning the new files makes it fail."""
    for attempt in range(RENAME_TRIES):
        try:
            source.rename(target)
            return
        except PermissionError:
            if attempt == RENAME_TRIES - 1:
                raise
            time.sleep(RENAME_WAIT_S)


class Installer:
    """Runs the plan's steps; `on_progress(Progress)` is called from the thread that calls run()."""

    def __init__(self, plan: RuntimePlan, on_progress=lambda progress: None):
        self.plan = plan
        self.on_progress = on_progress
        self._process: subprocess.Popen | None = None
        self._cancelled = False

    def run(self) -> Path:
        """Install the plan; the runtime's folder, complete. InstallError (NoNetwork: the index cannot be
        reached) says what went wrong."""
        plan = self.plan
        if is_complete(plan.target):
            return plan.target
        plan.root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        installed = int(plan.choice.variant.installed_gb * GB)
        if plan.wheels is None:
            files = self._download(installed)
        elif not plan.wheels.is_dir():
            raise InstallError(f"The wheel folder {plan.wheels} does not exist.")
        else:
            check_space(plan.root, 0, installed)
            report = self._resolve(["--no-index", "--find-links", str(plan.wheels)])
            files = [Path(urllib.request.url2pathname(urllib.parse.urlsplit(item["download_info"]["url"]).path))
                     for item in report["install"]]
        progress = Progress("Installing", count=len(files))

        def unpacked(done: int, total: int) -> None:
            if self._cancelled:
                raise InstallError("Cancelled.")
            progress.done, progress.total = done, total
            self.on_progress(progress)

        try:
            unpack_all(files, plan.staging, unpacked)
        except (BadWheel, zipfile.BadZipFile) as e:
            raise InstallError(f"a wheel could not be installed: {e}") from e
        self._finish(time.monotonic() - started)
        self.on_progress(Progress("Done", str(plan.target)))
        return plan.target

    def cancel(self) -> None:
        self._cancelled = True
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def _resolve(self, index_args: list[str]) -> dict:
        """pip's dry-run report of the plan's packages: the wheels to install, with their URLs and SHA-256s."""
        self.on_progress(Progress("Resolving"))
        report = self.plan.root / "resolved.json"
        self._pip(["install", "--dry-run", "--quiet", "--ignore-installed", "--only-binary=:all:", "--target",
                   str(self.plan.staging), "--report", str(report), *index_args, *self.plan.requirements])
        return json.loads(report.read_text(encoding="utf-8"))

    def _download(self, installed: int) -> list[Path]:
        plan = self.plan
        with ThreadPoolExecutor() as pool:        # together: a dropped connection waits out its time-out once
            answers = list(pool.map(reachable, plan.index_urls))
        for index, answered in zip(plan.index_urls, answers):
            if not answered:
                host = urllib.parse.urlsplit(index).hostname
                raise NoNetwork(f"No network: {host} cannot be reached, so the engine cannot be downloaded. "
                                f"Connect to the internet and Try again, or install from a folder of wheels.")
        try:
            wheels = wheels_of(self._resolve(plan.index_args))
            folder = plan.download_dir
            folder.mkdir(exist_ok=True)
            wheels = [w if (folder / w.name).is_file() else with_size(w) for w in wheels]
            progress = Progress("Downloading", count=len(wheels), total=sum(w.size for w in wheels))
            partial = sum((folder / f"{w.name}.part").stat().st_size for w in wheels
                          if (folder / f"{w.name}.part").is_file())
            check_space(plan.root, progress.total - partial, installed)
            files = []
            for wheel in wheels:
                progress.detail = wheel.name

                def moved(n: int) -> None:
                    progress.done += n
                    self.on_progress(progress)

                files.append(fetch(wheel, folder, moved, lambda: self._cancelled))
                progress.files += 1
                self.on_progress(progress)
            return files
        except DownloadError as e:
            raise InstallError(str(e)) from e

    def _pip(self, args: list[str]) -> None:
        flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) if sys.platform == "win32" else 0
        self._process = subprocess.Popen([*pip_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace", env=pip_env(), creationflags=flags)
        tail = self._process.communicate()[0].splitlines()[-20:]
        if self._cancelled:
            raise InstallError("Cancelled.")
        if self._process.returncode != 0:
            errors = [t for t in tail if t.startswith("ERROR")] or tail[-3:]
            raise InstallError(f"pip {args[0]} failed (exit code {self._process.returncode}): " + " ".join(errors))

    def _finish(self, seconds: float) -> None:
        """Mark the staged runtime complete, then make it the runtime; older runtimes and downloads go."""
        plan = self.plan
        if plan.with_compiler:
            write_cc_wrapper(plan.staging)
        (plan.staging / MARKER).write_text(json.dumps({
            "variant": plan.choice.variant.name, "requirements": plan.requirements, "seconds": round(seconds, 1),
            "source": str(plan.wheels) if plan.wheels else plan.index_urls[0]}, indent=1), encoding="utf-8")
        shutil.rmtree(plan.target, ignore_errors=True)
        rename_with_retry(plan.staging, plan.target)
        for other in plan.root.iterdir():
            if other != plan.target:
                shutil.rmtree(other, ignore_errors=True) if other.is_dir() else other.unlink(missing_ok=True)


def cc_wrapper(runtime: Path) -> Path:
    return runtime / "bin" / "cc"


def write_cc_wrapper(runtime: Path) -> None:
    """A `cc` that runs zig's C compiler (the ziglang wheel ships zig and its libc headers)."""
    wrapper = cc_wrapper(runtime)
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text('#!/bin/sh\nexec "$(dirname "$0")/../ziglang/zig" cc "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)

"""The installed app's entry point (installer/qwendesk.spec freezes this script).

The frozen app carries everything but the PyTorch stack (torch, Triton, fla: 0.3 to 5 GB depending on the
build). At launch: when torch is not importable, the runtime this machine needs (installer/firstrun) is found
in the user's data folder or installed there by the first-launch window; its folder goes on sys.path, Triton
gets its compiler and a per-user cache, and the app starts. Nothing is written under the install folder: Python's
bytecode (of the runtime and of the app's own .py sources) goes to the user's cache folder. `qwendesk --pip ARGS`
runs the bundled pip: the installer's pip steps run the app's own executable that way (there is no other Python on
the user's machine). Settings' "Remove and quit…" (app/runtime_card.py) has the runtime removed once the app has
quit: here on Linux, by `qwendesk --remove-runtime ROOT` started apart on Windows (it waits for the files to be
let go).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REMOVE_TRIES = 60          # seconds, once a second: the app's process lets go of the runtime's DLLs as it ends


def run_pip(args: list[str]) -> int:
    from pip._internal.cli.main import main as pip_main

    if sys.stdout is None:      # a windowed executable started without pipes: pip still works, unseen
        sys.stdout = sys.stderr = open(os.devnull, "w")
    return pip_main(args)


def use_runtime(runtime: Path) -> None:
    """Put the runtime on sys.path (after the app's own modules) and point Triton at its C compiler: zig's
    when the runtime carries one (Linux without gcc or clang), TinyCC from triton-windows on Windows."""
    from installer.firstrun.install import cc_wrapper

    from app.runtime_card import RUNTIME_ENV

    sys.path.append(str(runtime))
    os.environ[RUNTIME_ENV] = str(runtime)
    compilers = [cc_wrapper(runtime), runtime / "triton" / "runtime" / "tcc" / "tcc.exe"]
    for compiler in compilers:
        if compiler.is_file() and "CC" not in os.environ:
            os.environ["CC"] = str(compiler)


def cache_root() -> Path:
    import platformdirs

    return Path(os.environ.get("QWENDESK_CACHE_DIR") or platformdirs.user_cache_dir("qwendesk", appauthor=False))


def use_cache() -> None:
    """Triton's compiled kernels and Python's bytecode in the user's cache folder (per user; an uninstall can
    remove it), never next to the sources: the install folder stays as installed. PyInstaller turns bytecode off;
    without it every launch recompiles torch."""
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_root() / "triton"))
    sys.pycache_prefix = str(cache_root() / "pycache")
    sys.dont_write_bytecode = False


def remove_runtime(root: Path, tries: int = 1) -> bool:
    """The runtimes under `root` and their bytecode, tried `tries` times a second apart; whether it worked."""
    from installer.firstrun.install import remove_runtimes

    for attempt in range(tries):
        try:
            remove_runtimes(root)
            shutil.rmtree(cache_root() / "pycache", ignore_errors=True)
            return True
        except OSError:
            time.sleep(1 if attempt < tries - 1 else 0)
    return False


def remove_after_exit(runtime: Path) -> None:
    """What Settings' "Remove and quit…" asked for, now that the app has quit."""
    if sys.platform != "win32":
        remove_runtime(runtime.parent)
        return
    flags = subprocess.CREATE_NO_WINDOW | subprocess.DETACHED_PROCESS | subprocess.CREATE_NEW_PROCESS_GROUP
    subprocess.Popen([sys.executable, "--remove-runtime", str(runtime.parent)], creationflags=flags,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def ensure_runtime() -> Path | None:
    """The runtime folder this machine needs, installed by the first-launch window if it is not there yet;
    None when the user closed that window (then the app does not start)."""
    from installer.firstrun.gpu import detect_gpus
    from installer.firstrun.install import is_complete, kept_gpu_runtime
    from installer.firstrun.plan import make_plan

    plan = make_plan(detect_gpus())
    if is_complete(plan.target):
        return plan.target
    if kept := kept_gpu_runtime(plan):
        return kept
    from installer.firstrun.window import provision

    return provision(plan)


def main() -> int:
    if sys.argv[1:2] == ["--pip"]:
        return run_pip(sys.argv[2:])
    if sys.argv[1:2] == ["--remove-runtime"]:
        return 0 if remove_runtime(Path(sys.argv[2]), REMOVE_TRIES) else 1
    use_cache()
    runtime = None
    if importlib.util.find_spec("torch") is None:
        runtime = ensure_runtime()
        if runtime is None:
            return 1
        use_runtime(runtime)
    from app.main import main as app_main
    from app.runtime_card import REMOVE_ENV

    code = app_main()
    if runtime is not None and os.environ.get(REMOVE_ENV):
        remove_after_exit(runtime)
    return code


if __name__ == "__main__":
    sys.exit(main())

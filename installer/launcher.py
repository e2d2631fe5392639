"""The installed app's entry point (installer/qwendesk.spec freezes this script).

The frozen app carries everything but the PyTorch stack (torch, Triton, fla: 0.3 to 5 GB depending on the
build). At launch: when torch is not importable, the runtime this machine needs (installer/firstrun) is found
in the user's data folder or installed there by the first-launch window; its folder goes on sys.path, Triton
gets its compiler and a per-user cache, and the app starts. `qwendesk --pip ARGS` runs the bundled pip: the
installer's pip steps run the app's own executable that way (there is no other Python on the user's machine).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def run_pip(args: list[str]) -> int:
    from pip._internal.cli.main import main as pip_main

    if sys.stdout is None:      # a windowed executable started without pipes: pip still works, unseen
        sys.stdout = sys.stderr = open(os.devnull, "w")
    return pip_main(args)


def use_runtime(runtime: Path) -> None:
    """Put the runtime on sys.path (after the app's own modules) and point Triton at its C compiler: zig's
    when the runtime carries one (Linux without gcc or clang), TinyCC from triton-windows on Windows."""
    from installer.firstrun.install import cc_wrapper

    sys.path.append(str(runtime))
    sys.dont_write_bytecode = False     # PyInstaller turns it off: without .pyc files every launch recompiles torch
    compilers = [cc_wrapper(runtime), runtime / "triton" / "runtime" / "tcc" / "tcc.exe"]
    for compiler in compilers:
        if compiler.is_file() and "CC" not in os.environ:
            os.environ["CC"] = str(compiler)


def use_cache() -> None:
    """Triton's compiled kernels in the user's cache folder (per user; an uninstall can remove it)."""
    import platformdirs

    os.environ.setdefault("TRITON_CACHE_DIR", str(Path(platformdirs.user_cache_dir("qwendesk", appauthor=False),
                                                        "triton")))


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
    use_cache()
    if importlib.util.find_spec("torch") is None:
        runtime = ensure_runtime()
        if runtime is None:
            return 1
        use_runtime(runtime)
    from app.main import main as app_main

    return app_main()


if __name__ == "__main__":
    sys.exit(main())

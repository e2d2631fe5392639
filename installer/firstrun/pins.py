"""The PyTorch stack the first launch installs: one torch release and the versions that must go with it.

Decided here, not read from the build machine (a CPU build environment with its own triton once pinned a triton
that torch's CUDA build refuses: every GPU user's first launch failed to resolve). `triton` is the version torch's
own Linux wheels require (their Requires-Dist: `triton==3.7.1; platform_system == "Linux"`); every build of one
torch release pins the same triton, and the CPU build, which requires none, gets the same. `triton-windows` is that
Triton release built for Windows (its version is Triton's plus a .postN of its own). `make check-plans`
(installer/check_plans.py) resolves every plan against the package indexes and checks these against the torch
wheels' metadata captured in installer/firstrun/torch_metadata.json; moving TORCH means running
`python -m installer.check_plans --capture` and setting what it reports.
"""

TORCH = "2.13.0"
PACKAGES = {                    # sys.platform -> what is installed beside torch, pinned
    "linux": {"triton": "3.7.1", "fla-core": "0.6.0"},
    "win32": {"triton-windows": "3.7.1.post27"},
}
# Linux without a C compiler: Triton builds its launcher stubs with zig's (installer/launcher.py points CC at it)
COMPILER = ("ziglang", "0.17.1")
PYTHONS = ("3.11", "3.12")      # the Pythons a frozen app is built with (here, and the release workflows)

"""Does every first-launch plan resolve? Each (platform, build, Python) plan's requirements (installer/firstrun/plan.py)
go through pip's resolver in dry-run mode, for the target's platform, as the user's machine would run it:

    python -m installer.check_plans                 # every plan; exit 1 if one does not resolve (make check-plans)
    python -m installer.check_plans --strict        # also exit 1 if one could not be checked (the release workflow)
    python -m installer.check_plans --capture [WHEEL ...]    # rewrite installer/firstrun/torch_metadata.json
                                                    # (torch's Requires-Dist and its longest file names)

Where a plan's torch comes from decides how it is checked, first that works:
1. the PyTorch index of its build, when reachable: the plan itself, as the first launch installs it;
2. PyPI, when PyPI's torch of that version is the same build for that platform (Linux: the default CUDA build;
   Windows: the CPU build), recognised from its own Requires-Dist: the plan with torch's public version;
3. the torch wheel's metadata captured in torch_metadata.json (with the date, from PyPI or from a wheel file):
   the other pins and torch's Requires-Dist for that target, resolved on PyPI.
Before resolving, our pins are checked against torch's own requirements for the target (a conflict fails at once).
A plan none of these covers is reported as not checked; one whose resolution fails only because the registry
reached lacks a version that torch itself pins (a partial mirror) as "registry lacks".

pip evaluates environment markers for the machine it runs on, whatever --platform says: each resolution runs pip
with the target's marker environment (a Linux host must not give a Windows plan torch's Linux-only requirements).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from packaging.markers import InvalidMarker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from installer.firstrun import pins
from installer.firstrun.install import pip_env
from installer.firstrun.plan import CPU, GPU_VARIANTS, PYPI_INDEX, PYTORCH_INDEX, RuntimePlan, choose

METADATA = Path(__file__).resolve().parent / "firstrun" / "torch_metadata.json"
PLATFORM_TAGS = {"linux": ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                           "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"],
                 "win32": ["win_amd64"]}
MARKERS = {"linux": {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                     "platform_machine": "x86_64"},
           "win32": {"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt",
                     "platform_machine": "AMD64"}}
# pip run with another machine's marker environment (see the module's docstring)
PIP_FOR_TARGET = """import sys, pip._vendor.packaging.markers as m
target = dict(m.default_environment(), **{ENV!r})
m.default_environment = lambda: dict(target)
from pip._internal.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def marker_env(platform: str, python: str) -> dict:
    return {**MARKERS[platform], "python_version": python, "python_full_version": f"{python}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def resolve(platform: str, python: str, requirements: list[str], index: list[str], deps: bool = True) -> dict:
    """pip's dry-run report of installing `requirements` on that target; RuntimeError with pip's error otherwise."""
    with tempfile.TemporaryDirectory() as work:
        report = Path(work, "report.json")
        args = ["install", "--dry-run", "--quiet", "--ignore-installed", "--target", str(Path(work, "t")),
                "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                *(f"--platform={tag}" for tag in PLATFORM_TAGS[platform]), "--report", str(report), *index,
                *([] if deps else ["--no-deps"]), *requirements]
        code = PIP_FOR_TARGET.replace("{ENV!r}", repr(marker_env(platform, python)))
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=pip_env())
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.strip()]
            raise RuntimeError(" / ".join(errors[-6:]))
        return json.loads(report.read_text(encoding="utf-8"))


def applies(requirement: Requirement, env: dict) -> bool:
    try:
        return requirement.marker is None or requirement.marker.evaluate(env)
    except InvalidMarker:
        return False


def build_of(version: str, requires_dist: list[str], env: dict) -> str:
    """The PyTorch build a torch wheel is: its local version (2.13.0+cu128), else the CUDA release its own
    requirements pin for that target (cuda-toolkit==13.0.3 or nvidia-cuda-runtime-cu12==12.8.90: cu130, cu128),
    else the CPU build."""
    if "+" in version:
        return version.split("+", 1)[1]
    for line in requires_dist:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) in ("cuda-toolkit", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime") \
                and applies(requirement, env):
            pinned = next(s.version for s in requirement.specifier if s.operator == "==")
            return "cu" + "".join(pinned.split(".")[:2])
    return "cpu"


def index_reachable(variant: str) -> bool:
    try:
        with urllib.request.urlopen(PYTORCH_INDEX.format(variant=variant) + "/torch/", timeout=10):
            return True
    except OSError:
        return False


def captured() -> dict:
    return json.loads(METADATA.read_text(encoding="utf-8")) if METADATA.is_file() else {"builds": {}}


def other_pins(requirements: list[str]) -> list[str]:
    return [r for r in requirements if not r.startswith("torch==")]


def conflicts(requirements: list[str], torch_needs: list[str]) -> list[str]:
    """Our pins that torch's own requirements refuse (triton 3.9.0 where torch says triton==3.7.1)."""
    pinned = {canonicalize_name(Requirement(r).name): Requirement(r) for r in requirements}
    found = []
    for line in torch_needs:
        need = Requirement(line)
        ours = pinned.get(canonicalize_name(need.name))
        if ours is not None:
            version = next(iter(ours.specifier)).version
            if not need.specifier.contains(version, prereleases=True):
                found.append(f"torch requires {need.name}{need.specifier}, the pin is {version}")
    return found


def linux_triton(metadata: dict) -> str:
    """The Triton every Linux build of this torch requires (from its captured metadata); '' if none captured."""
    for key, build in metadata["builds"].items():
        for line in build["requires_dist"]:
            need = Requirement(line)
            if key.startswith("linux-") and need.name == "triton" and applies(need, marker_env("linux", "3.12")):
                return next(iter(need.specifier)).version
    return ""


def windows_pair(requirements: list[str], metadata: dict) -> list[str]:
    """triton-windows must be the Triton release torch pairs with on Linux (torch's Windows wheels name none)."""
    wanted = linux_triton(metadata)
    for line in requirements:
        if line.startswith("triton-windows=="):
            version = line.split("==")[1]
            if wanted and version.split(".post")[0] != wanted:
                return [f"torch {pins.TORCH} pairs with Triton {wanted}, triton-windows is {version}"]
    return []


def missing_from_registry(error: str, ours: list[str], torch_needs: list[str]) -> tuple[str, str]:
    """(what is missing, which of torch's requirements brought it) when pip failed only because the registry lacks
    a version that torch's own requirements pin (nvidia-nccl-cu13==2.29.7 from torch; nvidia-cuda-cupti from
    cuda-toolkit); ('', '') for any other failure, ours included."""
    match = re.search(r"No matching distribution found for (\S+) \(from ([A-Za-z0-9_.-]+)", error)
    if not match:
        return "", ""
    missing, parent = match.group(1), canonicalize_name(match.group(2))
    if canonicalize_name(Requirement(missing).name) in {canonicalize_name(Requirement(r).name) for r in ours}:
        return "", ""
    direct = {canonicalize_name(Requirement(r).name) for r in torch_needs}
    if parent == "torch":
        return missing, canonicalize_name(Requirement(missing).name)
    return (missing, parent) if parent in direct else ("", "")


def check(platform: str, variant: str, python: str, reachable: bool, metadata: dict) -> tuple[str, str]:
    """(state, detail): state is resolves, FAILS, 'registry lacks' (only versions torch itself pins are missing
    from the registry reached: everything else resolved, our pins agree with torch's) or 'not checked'."""
    plan = RuntimePlan(choose([], platform, variant), Path("."), python=python, with_compiler=platform == "linux")
    requirements = plan.requirements
    build = metadata["builds"].get(f"{platform}-{variant}")
    pypi = ["--index-url", PYPI_INDEX]
    if reachable:
        try:
            resolve(platform, python, requirements, ["--index-url", PYTORCH_INDEX.format(variant=variant),
                                                     "--extra-index-url", PYPI_INDEX])
            return "resolves", "via the PyTorch index"
        except RuntimeError as e:
            return "FAILS", str(e)
    if build is None:
        return "not checked", "no reachable index, no captured metadata"
    env = marker_env(platform, python)
    torch_needs = [r for r in build["requires_dist"] if applies(Requirement(r), env)]
    if found := conflicts(requirements, torch_needs) + windows_pair(requirements, metadata):
        return "FAILS", "; ".join(found)
    if build["from"] == PYPI_INDEX:
        how = f"PyPI (its torch {pins.TORCH} is the {variant} build for {platform})"
        wanted = [f"torch=={pins.TORCH}", *other_pins(requirements)]
    else:
        how = f"torch's metadata captured {metadata['captured']} ({build['wheel']}) + PyPI"
        wanted = [*other_pins(requirements), *torch_needs]
    missing, dropped = [], set()
    while True:
        try:
            resolve(platform, python, wanted, pypi)
        except RuntimeError as e:
            gap, via = missing_from_registry(str(e), requirements, torch_needs)
            if not gap or len(missing) >= 8:
                return "FAILS", str(e)
            # again without the requirement of torch's that needs it: does everything else resolve?
            missing.append(gap if via == canonicalize_name(Requirement(gap).name) else f"{gap} (for {via})")
            dropped.add(via)
            wanted = [*other_pins(requirements), *(r for r in torch_needs
                                                   if canonicalize_name(Requirement(r).name) not in dropped)]
            continue
        if missing:
            return "registry lacks", (f"{', '.join(missing)}: torch's own requirements, not on the registry reached; "
                                      f"all else resolves via {how}")
        return "resolves", f"via {how}"


class RemoteFile(io.RawIOBase):
    """A file on a server read with Range requests: a wheel's file list (its zip directory, at the end) without
    downloading the wheel."""

    def __init__(self, url: str):
        self.url, self.pos = url, 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as response:
            self.size = int(response.headers["Content-Length"])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read()
        self.pos += len(data)
        return data


def longest_paths(wheel, count: int = 3) -> list[str]:
    """The longest file names in a wheel (a path or a RemoteFile): what the Windows path check measures."""
    with zipfile.ZipFile(wheel) as z:
        return sorted(z.namelist(), key=len, reverse=True)[:count]


def add(builds: dict, key: str, build: dict) -> None:
    """One entry per build: its wheels for each Python carry the same requirements (markers tell Pythons apart)."""
    if key in builds and builds[key]["requires_dist"] != build["requires_dist"]:
        raise SystemExit(f"{key}: {builds[key]['wheel']} and {build['wheel']} require different packages")
    builds.setdefault(key, build)


def capture(wheels: list[Path]) -> dict:
    """torch's Requires-Dist for every target PyPI serves and for the given wheel files."""
    builds = {}
    for platform in PLATFORM_TAGS:
        for python in pins.PYTHONS:
            report = resolve(platform, python, [f"torch=={pins.TORCH}"], ["--index-url", PYPI_INDEX], deps=False)
            (item,) = report["install"]
            requires = item["metadata"].get("requires_dist", [])
            variant = build_of(item["metadata"]["version"], requires, marker_env(platform, python))
            url = item["download_info"]["url"]
            add(builds, f"{platform}-{variant}", {
                "from": PYPI_INDEX, "wheel": url.rsplit("/", 1)[-1], "longest_paths": longest_paths(RemoteFile(url)),
                "sha256": item["download_info"]["archive_info"]["hashes"]["sha256"], "requires_dist": requires})
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(name).decode()
        fields = [line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines() if ": " in line]
        version = next(v for k, v in fields if k == "Version")
        requires = [v for k, v in fields if k == "Requires-Dist"]
        tags = wheel.name.removesuffix(".whl").split("-")[-3:]
        python = f"{tags[0][2]}.{tags[0][3:]}"
        platform = "win32" if tags[2].startswith("win") else "linux"
        add(builds, f"{platform}-{build_of(version, requires, marker_env(platform, python))}",
            {"from": "wheel file", "wheel": wheel.name, "longest_paths": longest_paths(wheel),
             "requires_dist": requires})
    return {"torch": pins.TORCH, "captured": datetime.date.today().isoformat(), "builds": dict(sorted(builds.items()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strict", action="store_true", help="a plan that could not be checked fails too")
    parser.add_argument("--capture", nargs="*", type=Path, metavar="WHEEL",
                        help="rewrite the captured torch metadata (from PyPI and these torch wheel files)")
    args = parser.parse_args()
    if args.capture is not None:
        METADATA.write_text(json.dumps(capture(args.capture), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {METADATA}")
        return 0
    metadata = captured()
    if metadata.get("torch") != pins.TORCH:
        print(f"torch_metadata.json is for torch {metadata.get('torch')}, the pin is {pins.TORCH}: --capture it")
        return 1
    passed = failed = unchecked = 0
    for variant in (*(v.name for v in GPU_VARIANTS), CPU.name):
        reachable = index_reachable(variant)
        for platform in PLATFORM_TAGS:
            for python in pins.PYTHONS:
                state, detail = check(platform, variant, python, reachable, metadata)
                passed += state == "resolves"
                failed += state == "FAILS"
                unchecked += state in ("not checked", "registry lacks")
                print(f"{platform:6} {variant:6} py{python}: {state}: {detail}", flush=True)
    print(f"check-plans: {passed} passed, {failed} failed, {unchecked} skipped")   # skipped: not fully checked
    return 1 if failed or (args.strict and unchecked) else 0


if __name__ == "__main__":
    sys.exit(main())

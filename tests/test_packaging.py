"""The packaged app (`make test-package`: builds it first). The frozen onedir installs its CPU runtime from a
local wheel folder on its first launch and passes the smoke run twice, leaving its install folder as it was;
without network and without wheels its first launch says "No network" within seconds; the AppDir's AppRun passes
the smoke run from a path with spaces; the AppImage's squashfs holds exactly the AppDir and runs it; the bundle's
newest glibc is reported; the desktop entry, the AppStream metadata and the workflows validate. Measures go to
test-artifacts/package-measures.json."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.package
ROOT = Path(__file__).resolve().parent.parent
ONEDIR = ROOT / "dist" / "qwendesk"
APPDIR = ROOT / "dist" / "QwenDesk.AppDir"
IMAGES = (ROOT / "dist" / "QwenDesk-x86_64.AppImage", ROOT / "dist" / "QwenDesk-x86_64.squashfs")
WHEELS = ROOT / "build" / "wheels"
MEASURES = ROOT / "test-artifacts" / "package-measures.json"


def folder_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6, 1)


def record(key: str, value) -> None:
    MEASURES.parent.mkdir(exist_ok=True)
    measures = json.loads(MEASURES.read_text()) if MEASURES.is_file() else {}
    measures[key] = value
    MEASURES.write_text(json.dumps(measures, indent=1))


def smoke(app: Path, work: Path, runtime: Path, *extra: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "installer.smoke", "--app", str(app), "--work", str(work),
                           "--runtime-dir", str(runtime), "--timeout", "900", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])["runs"]
    for run in runs:
        assert run["exit_code"] == 0 and run["chat_output_tokens"] >= 1 and run["sdk"]["completion_tokens"] >= 1
    return runs


def listing(folder: Path) -> dict:
    """Every entry under `folder`: (size, mode, mtime) of files, the target of links; directories by name."""
    entries = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        entries[str(path.relative_to(folder))] = (os.readlink(path) if path.is_symlink() else
                                                  (info.st_size, info.st_mode, info.st_mtime_ns) if path.is_file()
                                                  else "dir")
    return entries


def tool(name: str, package: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    assert path, f"{name} is not installed: apt-get install {package}"
    return path


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    return tmp_path_factory.mktemp("runtime")


def test_the_frozen_app_installs_its_runtime_offline_then_runs(tmp_path, runtime):
    assert (ONEDIR / "qwendesk").is_file(), "no frozen app: run `make package` first"
    assert WHEELS.is_dir(), "no local wheel folder: run `make build/wheels` first"
    before = listing(ONEDIR)
    first, second = smoke(ONEDIR / "qwendesk", tmp_path, runtime, "--wheels", str(WHEELS), "--runs", "2")
    after = listing(ONEDIR)
    assert after == before, sorted(set(after.items()) ^ set(before.items()))[:10]     # no bytecode, no caches
    installed = [p for p in runtime.iterdir() if p.is_dir()]
    assert len(installed) == 1 and "-cpu-" in installed[0].name
    marker = json.loads((installed[0] / "qwendesk-runtime.json").read_text())
    assert marker["variant"] == "cpu" and marker["source"] == str(WHEELS)
    record("frozen", {"onedir_mb": folder_mb(ONEDIR), "runtime_mb": folder_mb(installed[0]),
                      "onedir_files": sum(1 for f in ONEDIR.rglob("*") if f.is_file()),
                      "runtime_install_s": marker["seconds"], "first_launch": first, "second_launch": second})


def test_the_appdir_runs_from_a_path_with_spaces(tmp_path, runtime):
    assert (APPDIR / "AppRun").is_file(), "no AppDir: run `make package` first"
    if not any(runtime.iterdir()):            # this test alone: install the runtime first
        smoke(ONEDIR / "qwendesk", tmp_path / "install", runtime, "--wheels", str(WHEELS))
    spaced = tmp_path / "a folder with spaces" / "Qwen Desk.AppDir"
    shutil.copytree(APPDIR, spaced, symlinks=True, copy_function=os.link)
    (run,) = smoke(spaced / "AppRun", tmp_path / "work", runtime)
    record("appdir", {"appdir_mb": folder_mb(APPDIR), "launch": run})


def test_the_desktop_entry_and_metainfo_validate():
    subprocess.run([tool("desktop-file-validate", "desktop-file-utils"), str(APPDIR / "qwendesk.desktop")], check=True)
    metainfo = APPDIR / "usr" / "share" / "metainfo" / "io.github.qwendesk.QwenDesk.metainfo.xml"
    subprocess.run([tool("appstreamcli", "appstream"), "validate", "--no-net", str(metainfo)], check=True)
    for icon in ("qwendesk.png", ".DirIcon", "usr/share/icons/hicolor/scalable/apps/qwendesk.svg"):
        assert (APPDIR / icon).is_file(), icon


def test_the_workflows_lint():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert len(workflows) >= 3
    subprocess.run([tool("actionlint", "the package extra: pip install -e .[package]"), *map(str, workflows)],
                   check=True, cwd=ROOT)


def test_without_network_or_wheels_the_first_launch_says_so(tmp_path):
    """A dead proxy stands for no network: the first-launch window says "No network" (not pip's resolver error)
    within 10 s of the start, and offers a folder of wheels (its screenshot: firstrun.png)."""
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWENDESK_")}
    env.update(QT_QPA_PLATFORM="offscreen", QWENDESK_SMOKE=str(work), QWENDESK_RUNTIME_DIR=str(tmp_path / "rt"),
               https_proxy="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
    started = time.monotonic()
    done = subprocess.run([str(ONEDIR / "qwendesk")], env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
    assert done.returncode == 1 and events[-1]["event"] == "failed" and events[-1]["offline"], events
    assert events[-1]["message"].startswith("No network: download.pytorch.org cannot be reached")
    assert seconds < 10 and (work / "firstrun.png").is_file()
    record("offline_first_launch", {"seconds_to_exit": round(seconds, 2), "message": events[-1]["message"]})


def elf_size(image: Path) -> int:
    """Where an AppImage's squashfs starts: the end of its runtime, an ELF64 file whose section headers come last."""
    with image.open("rb") as f:
        header = f.read(64)
    shoff, = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
    return shoff + shentsize * shnum


def digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else
            (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode & 0o111 != 0) if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_the_appimage_holds_the_appdir_and_runs_from_it(tmp_path, runtime, monkeypatch):
    """make appimage's squashfs (behind the AppImage runtime when one was given) unsquashed holds the AppDir file for
    file (contents, executable bits, links), and its AppRun passes the smoke run: what the runtime's
    --appimage-extract-and-run does. With a runtime, the AppImage itself runs too."""
    image = next((i for i in IMAGES if i.is_file()), None)
    assert image is not None, "no AppImage or squashfs image: run `make appimage` first"
    offset = elf_size(image) if image.suffix == ".AppImage" else 0
    extracted = tmp_path / "squashfs-root"
    subprocess.run([tool("unsquashfs", "squashfs-tools"), "-q", "-n", "-o", str(offset), "-d", str(extracted),
                    str(image)], check=True)
    assert digest(extracted) == digest(APPDIR)
    if not any(runtime.iterdir()):            # this test alone: install the runtime first
        smoke(ONEDIR / "qwendesk", tmp_path / "install", runtime, "--wheels", str(WHEELS))
    (run,) = smoke(extracted / "AppRun", tmp_path / "work", runtime)
    measures = {"file": image.name, "mb": round(image.stat().st_size / 1e6, 1), "launch": run}
    if offset:
        monkeypatch.setenv("APPIMAGE_EXTRACT_AND_RUN", "1")
        (measures["image_launch"],) = smoke(image, tmp_path / "work-image", runtime)
    record("appimage", measures)


def test_the_bundle_needs_no_newer_glibc_than_the_build_machine():
    """The newest GLIBC version any bundled library asks for: the release workflow builds on Ubuntu 22.04 and fails
    above 2.35; here (the build machine's glibc decides it) it is reported."""
    from installer.linux.glibc import report

    found = report(ONEDIR)
    host = tuple(int(part) for part in platform.libc_ver()[1].split("."))
    assert found["elf_files"] > 100 and tuple(int(p) for p in found["highest"].split(".")) <= host
    record("glibc", {**found, "build_machine": platform.libc_ver()[1]})

"""The packaged app (`make test-package`: builds it first). The frozen onedir installs its CPU runtime from a
local wheel folder on its first launch and passes the smoke run twice; the AppDir's AppRun passes it from a
path with spaces; the desktop entry, the AppStream metadata and the workflows validate. Measures go to
test-artifacts/package-measures.json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.package
ROOT = Path(__file__).resolve().parent.parent
ONEDIR = ROOT / "dist" / "qwendesk"
APPDIR = ROOT / "dist" / "QwenDesk.AppDir"
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
    first, second = smoke(ONEDIR / "qwendesk", tmp_path, runtime, "--wheels", str(WHEELS), "--runs", "2")
    installed = [p for p in runtime.iterdir() if p.is_dir()]
    assert len(installed) == 1 and "-cpu-" in installed[0].name
    marker = json.loads((installed[0] / "qwendesk-runtime.json").read_text())
    assert marker["variant"] == "cpu" and marker["source"] == str(WHEELS)
    record("frozen", {"onedir_mb": folder_mb(ONEDIR), "runtime_mb": folder_mb(installed[0]),
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

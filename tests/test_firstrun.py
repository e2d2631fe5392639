"""The first launch's runtime provisioning (installer/firstrun): the GPU check, the build it picks and what it
says, pip's progress lines, and a real offline install from a local wheel folder of small stand-in wheels
(the real torch wheels install the same way in the packaging tests: tests/test_packaging.py)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from installer.firstrun.gpu import NvidiaGpu, parse_nvidia_smi
from installer.firstrun.install import (MARKER, Installer, InstallError, Progress, is_complete, kept_gpu_runtime,
                                        read_progress)
from installer.firstrun import pins
from installer.firstrun.plan import CPU, RuntimePlan, choose


def gpu(driver: tuple[int, ...], name: str = "NVIDIA GeForce RTX 4090", cap=None) -> NvidiaGpu:
    return NvidiaGpu(name, ".".join(map(str, driver)), 24564, cap)


def test_nvidia_smi_lines_parse_and_junk_is_skipped():
    out = "NVIDIA GeForce RTX 4090, 575.57.08, 24564, 8.9\nNVIDIA RTX A6000, 535.104.05, 49140\n" \
          "No devices were found\nNVIDIA H200, [N/A], 143771, 9.0\nA, card, 580.95.05, 8192, [N/A]\n"
    assert parse_nvidia_smi(out) == [NvidiaGpu("NVIDIA GeForce RTX 4090", "575.57.08", 24564, (8, 9)),
                                     NvidiaGpu("NVIDIA RTX A6000", "535.104.05", 49140),
                                     NvidiaGpu("A, card", "580.95.05", 8192)]
    assert parse_nvidia_smi(out)[0].driver == (575, 57, 8)


@pytest.mark.parametrize("card, cap, driver, variant", [
    ("NVIDIA GeForce GTX 1080 Ti", (6, 1), (580, 95, 5), "cu126"),     # Pascal: CUDA 13 has no sm_61
    ("Tesla V100-SXM2-16GB", (7, 0), (580, 95, 5), "cu126"),           # Volta
    ("NVIDIA GeForce RTX 2080 Ti", (7, 5), (580, 95, 5), "cu130"),     # Turing
    ("NVIDIA GeForce RTX 3090", (8, 6), (575, 57, 8), "cu128"),        # Ampere
    ("NVIDIA GeForce RTX 4090", (8, 9), (565, 57, 1), "cu126"),        # Ada, a 565 driver
    ("NVIDIA GeForce RTX 5090", (12, 0), (575, 57, 8), "cu128"),       # Blackwell: not in CUDA 12.6's builds
    ("NVIDIA GeForce RTX 5090", (12, 0), (580, 95, 5), "cu130"),
    ("NVIDIA GeForce GTX 780", (3, 5), (580, 95, 5), "cpu")])          # Kepler: no build has it
def test_the_build_fits_the_cards_architecture(card, cap, driver, variant):
    choice = choose([gpu(driver, card, cap)], "linux")
    assert choice.variant.name == variant
    if variant == "cpu":
        assert "(compute capability 3.5) is older than any GPU engine supports" in choice.message
    else:
        assert card in choice.message and choice.variant.label in choice.message


def test_the_driver_shows_as_the_driver_reports_it():
    (card,) = parse_nvidia_smi("NVIDIA GeForce GTX 1080 Ti, 580.95.05, 11264, 6.1")
    assert "driver 580.95.05" in choose([card], "linux").message
    old = choose(parse_nvidia_smi("NVIDIA GeForce RTX 5090, 560.35.03, 32607, 12.0"), "linux").message
    assert "driver (560.35.03) is older than the 570.26" in old          # the oldest driver a Blackwell build runs on


@pytest.mark.parametrize("platform, driver, variant", [
    ("linux", (580, 95, 5), "cu130"), ("linux", (575, 57, 8), "cu128"), ("linux", (570, 26), "cu128"),
    ("linux", (565, 57, 1), "cu126"), ("win32", (580, 88), "cu130"), ("win32", (570, 64), "cu126"),
    ("win32", (560, 76), "cu126"), ("linux", (550, 54, 14), "cpu"), ("win32", (560, 70), "cpu")])
def test_the_newest_build_the_driver_runs_is_chosen(platform, driver, variant):
    assert choose([gpu(driver)], platform).variant.name == variant


def test_the_cpu_build_says_why_and_what_it_means():
    none = choose([], "linux")
    assert none.variant is CPU and "No NVIDIA GPU was found" in none.message
    assert "few tokens per second" in none.message
    old = choose([gpu((535, 104, 5))], "win32").message
    assert "driver (535.104.5) is older than the 560.76" in old and "Update the driver" in old     # gpu() joins ints
    assert "CUDA 12.8" in choose([gpu((575, 57, 8))], "linux").message


def test_a_forced_build_must_exist():
    assert choose([], "linux", "cu128").variant.name == "cu128"
    with pytest.raises(ValueError, match="QWENDESK_RUNTIME_VARIANT='cu99' is not one of"):
        choose([], "linux", "cu99")


def test_requirements_pin_the_build_and_its_index(tmp_path):
    plan = RuntimePlan(choose([gpu((575, 57, 8))], "linux"), tmp_path, python="3.11")
    assert plan.requirements == ["torch==2.13.0+cu128", "triton==3.7.1", "fla-core==0.6.0"]
    assert plan.index_args[1] == "https://download.pytorch.org/whl/cu128"
    assert plan.key == "torch-2.13.0-cu128-py311"
    windows = RuntimePlan(choose([], "win32"), tmp_path)
    assert windows.requirements == ["torch==2.13.0+cpu", "triton-windows==3.7.1.post27"]
    assert RuntimePlan(choose([], "linux"), tmp_path, with_compiler=True).requirements[-1] == "ziglang==0.17.1"


def test_the_pins_agree_with_torchs_own_requirements():
    """Offline, against the torch wheels' metadata captured in the repo (make check-plans resolves them online):
    torch 2.13.0's CUDA build requires triton==3.7.1; a build machine's triton 3.9.0 once made every GPU
    user's first launch unresolvable."""
    from installer.check_plans import captured, check, conflicts, linux_triton, windows_pair

    metadata = captured()
    assert metadata["torch"] == pins.TORCH and "linux-cu130" in metadata["builds"]
    assert linux_triton(metadata) == pins.PACKAGES["linux"]["triton"] == "3.7.1"
    cu130 = metadata["builds"]["linux-cu130"]["requires_dist"]
    plan = RuntimePlan(choose([], "linux", "cu130"), Path("."), python="3.12")
    assert conflicts(plan.requirements, cu130) == []
    assert conflicts(["triton==3.9.0"], cu130) == ["torch requires triton==3.7.1, the pin is 3.9.0"]
    windows = RuntimePlan(choose([], "win32", "cu128"), Path("."), python="3.12").requirements
    assert windows_pair(windows, metadata) == []
    assert windows_pair(["triton-windows==3.8.0.post29"], metadata) == [
        "torch 2.13.0 pairs with Triton 3.7.1, triton-windows is 3.8.0.post29"]
    assert check("win32", "cu126", "3.12", False, {"builds": {}}) == (
        "not checked", "no reachable index, no captured metadata")


def test_pip_output_becomes_progress():
    progress = Progress("Downloading")
    lines = ["Collecting torch==2.13.0+cu128",
             "Downloading https://x/whl/cu128/torch-2.13.0%2Bcu128-cp311.whl (900.1 MB)",
             "Progress 0 of 943820800", "Progress 471910400 of 943820800", "Saved ./torch.whl",
             "File was already downloaded /r/wheels/sympy-1.14.0-py3-none-any.whl",
             "Installing collected packages: a, b"]
    shown = [read_progress(line, progress) for line in lines]
    assert shown == [False, True, True, True, True, True, True]
    assert progress.files == 2 and progress.step == "Installing"
    progress = Progress("Downloading")
    for line in lines[1:4]:
        read_progress(line, progress)
    assert progress.detail == "torch-2.13.0%2Bcu128-cp311.whl"
    assert (progress.done, progress.total) == (471910400, 943820800)


def write_wheel(folder: Path, name: str, version: str, module: str) -> Path:
    """A minimal valid wheel of one module that records its own version."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = {f"{module}/__init__.py": f"__version__ = {version!r}\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name_in_zip, text in files.items():
            z.writestr(name_in_zip, text)
    return path


def test_offline_install_from_a_wheel_folder_resumes_after_a_failure(tmp_path):
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "torch", "2.13.0+cpu", "torch")
    write_wheel(wheels, "triton", "3.7.1", "triton")
    plan = RuntimePlan(choose([], "linux"), tmp_path / "runtime", wheels=wheels)
    seen: list[str] = []
    with pytest.raises(InstallError, match="pip install failed .*fla-core==0.6.0"):   # fla-core is missing
        Installer(plan, lambda p: seen.append(p.step)).run()
    assert not is_complete(plan.target) and not plan.target.exists()
    write_wheel(wheels, "fla-core", "0.6.0", "fla")
    target = Installer(plan, lambda p: seen.append(p.step)).run()
    assert target == plan.target and not plan.staging.exists() and seen[-1] == "Done"
    assert (target / "torch" / "__init__.py").read_text() == "__version__ = '2.13.0+cpu'\n"
    marker = json.loads((target / MARKER).read_text())
    assert marker["variant"] == "cpu" and marker["source"] == str(wheels)
    assert Installer(plan).run() == target          # complete: nothing to do


def test_a_gpu_runtime_outlives_a_failed_gpu_check(tmp_path, monkeypatch):
    cpu = RuntimePlan(choose([], "linux"), tmp_path)
    assert kept_gpu_runtime(cpu) is None
    gpu_plan = RuntimePlan(choose([gpu((575, 57, 8))], "linux"), tmp_path)
    gpu_plan.target.mkdir(parents=True)
    (gpu_plan.target / MARKER).write_text("{}")
    assert kept_gpu_runtime(cpu) == gpu_plan.target and kept_gpu_runtime(gpu_plan) is None
    monkeypatch.setattr(pins, "TORCH", "2.14.0")
    assert kept_gpu_runtime(cpu) is None            # an app update with a new torch installs anew


def test_the_window_installs_and_closes_with_the_runtime(qtbot, tmp_path):
    from installer.firstrun.window import FirstRunWindow

    wheels = tmp_path / "wheels"
    for name, version, module in (("torch", "2.13.0+cpu", "torch"), ("triton", "3.7.1", "triton"),
                                  ("fla-core", "0.6.0", "fla")):
        write_wheel(wheels, name, version, module)
    plan = RuntimePlan(choose([], "linux"), tmp_path / "runtime", wheels=wheels)
    window = FirstRunWindow(plan)
    qtbot.addWidget(window)
    assert "No NVIDIA GPU was found" in window.message.text() and str(wheels) in window.message.text()
    window.show()
    with qtbot.waitSignal(window.done, timeout=120_000) as done:
        window.start()
    assert done.args == [plan.target] and is_complete(plan.target) and not window.isVisible()

"""The first launch's runtime provisioning (installer/firstrun): the GPU check, the build it picks and what it
says, pip's progress lines, and a real offline install from a local wheel folder of small stand-in wheels
(the real torch wheels install the same way in the packaging tests: tests/test_packaging.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from installer.firstrun.gpu import NvidiaGpu, parse_nvidia_smi
from installer.firstrun.install import MARKER, Installer, InstallError, Progress, is_complete, kept_gpu_runtime
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
        assert "(compute capability 3.5) is older than any GPU engine supports" in choice.message()
    else:
        assert card in choice.message() and choice.variant.label in choice.message()


def test_the_driver_shows_as_the_driver_reports_it():
    (card,) = parse_nvidia_smi("NVIDIA GeForce GTX 1080 Ti, 580.95.05, 11264, 6.1")
    assert "driver 580.95.05" in choose([card], "linux").message()
    old = choose(parse_nvidia_smi("NVIDIA GeForce RTX 5090, 560.35.03, 32607, 12.0"), "linux").message()
    assert "driver (560.35.03) is older than the 570.26" in old          # the oldest driver a Blackwell build runs on


@pytest.mark.parametrize("platform, driver, variant", [
    ("linux", (580, 95, 5), "cu130"), ("linux", (575, 57, 8), "cu128"), ("linux", (570, 26), "cu128"),
    ("linux", (565, 57, 1), "cu126"), ("win32", (580, 88), "cu130"), ("win32", (570, 64), "cu126"),
    ("win32", (560, 76), "cu126"), ("linux", (550, 54, 14), "cpu"), ("win32", (560, 70), "cpu")])
def test_the_newest_build_the_driver_runs_is_chosen(platform, driver, variant):
    assert choose([gpu(driver)], platform).variant.name == variant


def test_the_cpu_build_says_why_and_what_it_means():
    none = choose([], "linux")
    assert none.variant is CPU and "No NVIDIA GPU was found" in none.message()
    assert "few tokens per second" in none.message()
    old = choose([gpu((535, 104, 5))], "win32").message()
    assert "driver (535.104.5) is older than the 560.76" in old and "Update the driver" in old     # gpu() joins ints
    assert "CUDA 12.8" in choose([gpu((575, 57, 8))], "linux").message()


def test_a_forced_build_must_exist():
    assert choose([], "linux", "cu128").variant.name == "cu128"
    with pytest.raises(ValueError, match="QWENDESK_RUNTIME_VARIANT='cu99' is not one of"):
        choose([], "linux", "cu99")


def test_requirements_pin_the_build_and_its_index(tmp_path):
    plan = RuntimePlan(choose([gpu((575, 57, 8))], "linux"), tmp_path, python="3.11")
    assert plan.requirements == ["torch==2.13.0+cu128", "triton==3.7.1", "fla-core==0.6.0"]
    assert plan.index_args[1] == "https://download.pytorch.org/whl/cu128"
    assert plan.key == "2.13.0-cu128-py311"
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


def test_a_registry_missing_what_torch_pins_is_told_apart_from_our_pins_failing():
    from installer.check_plans import missing_from_registry

    ours = ["torch==2.13.0", "triton==3.7.1", "fla-core==0.6.0"]
    needs = ["cuda-toolkit[cupti]==13.0.3", "nvidia-nccl-cu13==2.29.7", "triton==3.7.1"]
    nccl = "ERROR: No matching distribution found for nvidia-nccl-cu13==2.29.7 (from torch)"
    cupti = "ERROR: No matching distribution found for nvidia-cuda-cupti==13.0.85.* (from cuda-toolkit[cupti])"
    assert missing_from_registry(nccl, ours, needs) == ("nvidia-nccl-cu13==2.29.7", "nvidia-nccl-cu13")
    assert missing_from_registry(cupti, ours, needs) == ("nvidia-cuda-cupti==13.0.85.*", "cuda-toolkit")
    assert missing_from_registry("ERROR: No matching distribution found for triton==3.7.1", ours, needs) == ("", "")
    assert missing_from_registry("ERROR: No matching distribution found for triton==3.7.1 (from torch)", ours,
                                 needs) == ("", "")


def test_the_longest_installed_path_on_windows_stays_under_260_for_a_32_character_user():
    """From torch's own file list (captured from its Windows wheel; the PyTorch index's builds name their
    dist-info with the local version: torch-2.13.0+cu130.dist-info). pip's --target would add its temporary
    folder (%TEMP%\\pip-target-XXXXXXXX\\lib\\python\\, 31 more): the runtime is unpacked by the app instead."""
    from pathlib import PureWindowsPath

    from installer.check_plans import captured

    data = PureWindowsPath("C:\\Users", "u" * 32, "AppData", "Local", "qwendesk")     # platformdirs' user data dir
    longest = captured()["builds"]["win32-cpu"]["longest_paths"][0]
    assert len(longest) == 167
    paths = []
    for variant in ("cu130", "cu128", "cu126", "cpu"):
        plan = RuntimePlan(choose([], "win32", variant), Path(data, "r"), python="3.12")
        inside = longest.replace(f"torch-{pins.TORCH}.dist-info", f"torch-{pins.TORCH}+{variant}.dist-info")
        paths += [str(PureWindowsPath(str(folder).replace("/", "\\"), inside))
                  for folder in (plan.target, plan.staging)]
    worst = max(paths, key=len)
    assert len(worst) < 260, worst                  # 259 for the CUDA builds: no room left (a longer torch version)


def write_wheel(folder: Path, name: str, version: str, module: str, padding: int = 0) -> Path:
    """A minimal valid wheel of one module that records its own version (and `padding` random bytes)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = {f"{module}/__init__.py": f"__version__ = {version!r}\n",
             **({f"{module}/padding.bin": os.urandom(padding)} if padding else {}),
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


def wheel_metadata(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class WheelIndex:
    """A package index on the loopback (PEP 503 pages with SHA-256 fragments, PEP 658 metadata files, as the PyTorch
    index and PyPI serve) whose files honour Range requests; `cut` makes the next download of a file stop after
    that many bytes, as a dropped connection does; `ranges` holds where each wheel download started."""

    def __init__(self, folder: Path):
        import http.server
        import threading

        self.folder, self.cut, self.ranges = folder, {}, []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.do_GET(body=False)

            def do_GET(self, body=True):
                parts = self.path.strip("/").split("/")
                if parts[0] == "simple":
                    name = parts[1] if len(parts) > 1 else ""
                    links = "".join(f'<a href="/files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}" '
                                    f'data-dist-info-metadata="sha256={sha(wheel_metadata(w))}">{w.name}</a>'
                                    for w in sorted(index.folder.glob("*.whl"))
                                    if w.name.split("-")[0].replace("_", "-") == name)
                    return self.send(200, f"<html><body>{links}</body></html>".encode(), body)
                name = urllib.parse.unquote(parts[-1])
                if name.endswith(".metadata"):
                    return self.send(200, wheel_metadata(index.folder / name.removesuffix(".metadata")), body)
                data = (index.folder / name).read_bytes()
                start = int(self.headers["Range"][6:-1]) if self.headers.get("Range") else 0
                index.ranges.append(start)
                payload = data[start:]
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload[:index.cut.pop(name, len(payload))])

            def send(self, code, payload, body):
                self.send_response(code)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def wheel_index(tmp_path):
    files = tmp_path / "index"
    write_wheel(files, "torch", "2.13.0+cpu", "torch", padding=3 << 20)     # a few MiB: a cut mid-file
    write_wheel(files, "triton", "3.7.1", "triton")
    write_wheel(files, "fla-core", "0.6.0", "fla")
    index = WheelIndex(files)
    yield index
    index.close()


def test_a_download_cut_off_goes_on_where_it_stopped_and_is_checked(tmp_path, wheel_index):
    plan = RuntimePlan(choose([], "linux"), tmp_path / "runtime", indexes=(wheel_index.url,))
    torch_wheel = next(wheel_index.folder.glob("torch-*.whl"))
    wheel_index.cut[torch_wheel.name] = 1 << 20
    seen: list[Progress] = []
    with pytest.raises(InstallError, match="downloading torch-2.13.0.*stopped"):
        Installer(plan, lambda p: seen.append(dataclasses.replace(p))).run()
    part = plan.download_dir / f"{torch_wheel.name}.part"
    assert part.stat().st_size == 1 << 20 and not plan.target.exists()
    downloading = [p for p in seen if p.step == "Downloading"]
    assert downloading[-1].total == sum(f.stat().st_size for f in wheel_index.folder.glob("*.whl"))
    wheel_index.ranges.clear()
    target = Installer(plan, lambda p: seen.append(dataclasses.replace(p))).run()   # Try again (or a restart)
    assert 1 << 20 in wheel_index.ranges                  # asked for the rest only
    assert (target / "torch" / "__init__.py").is_file() and is_complete(target)
    assert sorted(p.name for p in plan.root.iterdir()) == [plan.key]    # the downloads went with success
    assert json.loads((target / MARKER).read_text())["source"] == wheel_index.url


def test_a_file_that_does_not_match_its_checksum_is_not_kept(tmp_path, wheel_index):
    from installer.firstrun.download import DownloadError, Wheel, fetch

    good = next(wheel_index.folder.glob("triton-*.whl"))
    url = wheel_index.url.replace("/simple", f"/files/{good.name}")
    folder = tmp_path / "wheels"
    folder.mkdir()
    with pytest.raises(DownloadError, match="did not match its SHA-256"):
        fetch(Wheel(url, "0" * 64), folder)
    assert list(folder.iterdir()) == []
    assert fetch(Wheel(url, sha(good.read_bytes())), folder).read_bytes() == good.read_bytes()
    with pytest.raises(DownloadError, match="https only"):
        fetch(Wheel("http://example.com/x.whl", "0" * 64), folder)


def test_no_space_says_how_much_is_needed(tmp_path):
    from installer.firstrun.install import check_space

    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(InstallError, match=r"Not enough free disk space .* GB needed .* GB free"):
        check_space(tmp_path, free, int(1e9))
    check_space(tmp_path, 0, 0)


def test_without_network_the_window_says_so_and_offers_a_folder(qtbot, tmp_path):
    """The index cannot be reached (a closed port on the loopback): 'No network' within seconds, not pip's
    resolver error, and a folder of wheels installs instead."""
    from installer.firstrun.window import FirstRunWindow

    wheels = tmp_path / "wheels"
    for name, version, module in (("torch", "2.13.0+cpu", "torch"), ("triton", "3.7.1", "triton"),
                                  ("fla-core", "0.6.0", "fla")):
        write_wheel(wheels, name, version, module)
    plan = RuntimePlan(choose([], "linux"), tmp_path / "runtime", indexes=("http://127.0.0.1:9/simple",))
    window = FirstRunWindow(plan)
    qtbot.addWidget(window)
    assert "about 0.5 GB to download" in window.message.text()
    window.show()
    started = time.monotonic()
    window.start()
    qtbot.waitUntil(lambda: window.retry.isVisible(), timeout=10_000)
    assert time.monotonic() - started < 10
    assert window.detail.text().startswith("No network: 127.0.0.1 cannot be reached")
    assert window.folder.isVisible() and window.folder.objectName() == "primary"
    window.grab().save(str(tmp_path / "offline.png"))
    with qtbot.waitSignal(window.done, timeout=120_000) as done:
        window.use_wheels(wheels)
    assert f"from the folder of wheels {wheels}" in window.message.text() and "GB to download" not in \
        window.message.text()
    assert done.args == [plan.target] and is_complete(plan.target)


def test_removing_the_runtime_takes_only_what_the_first_launch_put_there(tmp_path):
    from installer.firstrun.install import remove_runtimes

    plan = RuntimePlan(choose([], "linux"), tmp_path / "runtime")
    for folder in (plan.target, plan.staging, plan.download_dir):
        folder.mkdir(parents=True)
        (folder / "x.bin").write_bytes(b"x")
    (plan.target / MARKER).write_text("{}")
    remove_runtimes(plan.root)
    assert not plan.root.exists()
    shared = tmp_path / "shared"                    # QWENDESK_RUNTIME_DIR naming a folder with other files
    other = RuntimePlan(choose([], "linux"), shared)
    other.target.mkdir(parents=True)
    (other.target / MARKER).write_text("{}")
    (shared / "notes.txt").write_text("mine")
    (shared / "photos").mkdir()
    remove_runtimes(shared)
    assert sorted(p.name for p in shared.iterdir()) == ["notes.txt", "photos"]


def test_settings_remove_and_quit_asks_the_launcher_to_remove_the_runtime(qtbot, tmp_path, monkeypatch):
    from app.runtime_card import REMOVE_ENV, RUNTIME_ENV, RuntimeCard, runtime_folder

    from installer.launcher import remove_after_exit

    runtime = tmp_path / "runtime" / "torch-2.13.0-cpu-py311"
    runtime.mkdir(parents=True)
    (runtime / "big.bin").write_bytes(b"\0" * 3_000_000)
    (runtime / MARKER).write_text("{}")
    monkeypatch.delenv(REMOVE_ENV, raising=False)
    monkeypatch.setenv("QWENDESK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(RUNTIME_ENV, str(runtime))
    assert runtime_folder() == runtime
    card = RuntimeCard(runtime)
    qtbot.addWidget(card)
    assert "3.0 MB" in card.summary.text() and str(runtime.parent) in card.summary.text()
    with qtbot.waitSignal(card.quit_requested):
        card.request_removal()
    assert os.environ[REMOVE_ENV] == "1"
    remove_after_exit(runtime)                      # what the launcher does once the app has quit (Linux)
    assert not runtime.parent.exists()


def test_a_wheel_unpacks_with_its_data_and_modes_and_nothing_outside(tmp_path):
    from installer.firstrun.unpack import BadWheel, unpack_all

    wheel = tmp_path / "tool-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tool/__init__.py", "")
        binary = zipfile.ZipInfo("tool/bin/zig")
        binary.external_attr = 0o755 << 16
        z.writestr(binary, "#!/bin/sh\necho zig\n")
        z.writestr("tool-1.0.data/platlib/tool_ext.so", "so")
        z.writestr("tool-1.0.data/scripts/tool", "#!python")            # a console script: not needed, left out
        z.writestr("tool-1.0.dist-info/METADATA", "Name: tool\nVersion: 1.0\n")
    target = tmp_path / "target"
    seen = []
    unpack_all([wheel], target, lambda done, total: seen.append((done, total)))
    files = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert files == ["tool-1.0.dist-info/INSTALLER", "tool-1.0.dist-info/METADATA", "tool/__init__.py",
                     "tool/bin/zig", "tool_ext.so"]
    assert os.access(target / "tool" / "bin" / "zig", os.X_OK) and not os.access(target / "tool_ext.so", os.X_OK)
    assert seen[-1][0] == seen[-1][1] - len("#!python")
    evil = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../../outside.txt", "x")
    with pytest.raises(BadWheel, match="outside the wheel"):
        unpack_all([evil], tmp_path / "t2")
    assert not (tmp_path / "outside.txt").exists()


@pytest.mark.parametrize("body, release", [
    (b'{"tag_name": "v0.2.0", "html_url": "https://github.com/qwendesk/qwendesk/releases/tag/v0.2.0"}',
     ("0.2.0", "https://github.com/qwendesk/qwendesk/releases/tag/v0.2.0")),
    (b'{"tag_name": "v0.1.0", "html_url": "https://github.com/qwendesk/qwendesk/releases/tag/v0.1.0"}', None),
    (b'{"tag_name": "v0.0.9"}', None),
    (b'{"tag_name": "v1.0.0", "prerelease": true}', None),
    (b'{"tag_name": "v0.3.0", "html_url": "https://evil.example/qwendesk"}',          # a link elsewhere: the page
     ("0.3.0", "https://github.com/qwendesk/qwendesk/releases")),
    (b'{"tag_name": "v0.3.0<script>"}', None), (b"[1, 2]", None), (b"not json", None)])
def test_the_update_check_reads_the_feed_as_untrusted(body, release):
    from app.update_check import Release, newer_release

    assert newer_release(body, "0.1.0") == (Release(*release) if release else None)


def test_the_update_check_asks_the_feed_and_says_what_it_found(qtbot):
    import http.server
    import threading

    from app.update_check import UpdateCheck

    class Feed(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = b'{"tag_name": "v9.0.0", "html_url": "https://github.com/qwendesk/qwendesk/releases/tag/v9.0.0"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Feed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check = UpdateCheck("0.1.0", f"http://127.0.0.1:{server.server_address[1]}/latest")
        with qtbot.waitSignal(check.found, timeout=10_000) as found:
            check.start()
        assert found.args[0].version == "9.0.0"
    finally:
        server.shutdown()
        server.server_close()

"""Fault injection across processes (docs/reliability.md lists these with the tests that cover the other faults):

- qwendesk-serve killed (SIGKILL) in the middle of a stream, with the disk tier on: the OpenAI SDK raises at once (no
  hang), the app's remote backend ends its reply as an error; the server started again on the same port serves the
  same client objects, finds what the killed one wrote to its disk tier, and no temporary file is left;
- a model download killed (SIGKILL) in the middle of a file: the next start resumes it from the partial file and
  the files check out.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import openai
import pytest

from engine.api import SamplingParams
from tests.soak import free_port, get

ROOT = Path(__file__).resolve().parents[1]
MODEL_ID = "tiny"


def start_serve(checkpoint: Path, port: int, disk_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "engine.server.cli", "--model", str(checkpoint), "--port", str(port),
                             "--device", "cpu", "--profile", "C2", "--model-id", MODEL_ID, "--max-context", "2048",
                             "--disk-cache", "--disk-cache-dir", str(disk_dir), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "QWENDESK_API_KEY": "", "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if get(port, "/health", timeout=2)[0] == 200:
                return proc
        except OSError:
            pass
        assert time.monotonic() < deadline, "qwendesk-serve did not start"
        time.sleep(0.1)


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


LONG = [{"role": "user", "content": " ".join(["conversation"] * 60)}]      # several pages for the disk tier


def test_server_killed_mid_stream_clean_errors_then_the_restarted_server_serves_with_its_disk_tier(
        checkpoint, tmp_path, qtbot):
    from app.remote_client import RemoteBackend

    port, disk = free_port(), tmp_path / "kv"
    base_url = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=30)
    remote = RemoteBackend(base_url, model=MODEL_ID)
    proc = start_serve(checkpoint("base"), port, disk)
    deltas = []

    def on_delta(*args):                # the app's reply is under way: the server dies now (both streams open)
        deltas.append(args)
        if len(deltas) == 3:
            kill9(proc)

    try:
        first = client.chat.completions.create(model=MODEL_ID, messages=LONG, max_tokens=2)
        assert first.usage.prompt_tokens > 256
        stream = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=2000, stream=True, extra_body={"ignore_eos": True})
        for _ in range(3):
            next(stream)
        remote.delta.connect(on_delta)
        # greedy from this prompt, the tiny model does not end by itself within 2,000 tokens: the kill cuts it
        with qtbot.waitSignal(remote.reply_finished, timeout=30_000) as cut:
            remote.generate("r1", [{"role": "user", "content": "Hello"}],
                            SamplingParams(max_tokens=2000, temperature=0.0), {})
        remote.delta.disconnect(on_delta)
        assert len(deltas) >= 3 and cut.args[1].finish_reason == "error", cut.args[1]
        assert "broke" in cut.args[1].error or "ended early" in cut.args[1].error, cut.args[1].error
        t0 = time.monotonic()
        with pytest.raises((openai.APIError, httpx.TransportError)):      # the SDK lets httpx's cut body through
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 5, "the client hung on a dead server"

        # while the server is down, a new reply ends as an error at once, saying why
        with qtbot.waitSignal(remote.reply_finished, timeout=10_000) as down:
            remote.generate("r2", [{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=8), {})
        assert down.args[1].finish_reason == "error" and "cannot reach" in down.args[1].error

        proc = start_serve(checkpoint("base"), port, disk)                # restarted on the same port
        assert not list(disk.rglob(".tmp-*"))
        again = client.chat.completions.create(model=MODEL_ID, messages=LONG, max_tokens=2)
        assert again.usage.prompt_tokens_details.cached_tokens > 0       # read back from the disk tier
        with qtbot.waitSignal(remote.reply_finished, timeout=30_000) as up:
            remote.generate("r3", [{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=8), {})
        assert up.args[1].finish_reason in ("stop", "length"), up.args[1]
    finally:
        proc.kill()
        proc.wait(10)


DOWNLOADER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from PySide6.QtCore import QCoreApplication
    from app.downloads import DownloadManager
    from app.store import Store
    app = QCoreApplication([])
    root, url = Path(sys.argv[1]), sys.argv[2]
    manager = DownloadManager(Store(root / "qwendesk.sqlite3"), root / "models", endpoint=url, chunk_size=8192)
    manager.start("Qwen/Qwen3.5-Tiny")
    app.exec()
""")


def test_a_download_killed_mid_file_resumes_from_its_partial_file_at_the_next_start(checkpoint, tmp_path, qtbot):
    from app.downloads import DownloadManager
    from app.store import Store
    from tests.app_support import FakeHub
    from tests.test_app_downloads import REPO, WEIGHTS, files_match

    hub = FakeHub({REPO: Path(checkpoint("base"))})
    hub.delay = 0.005                                   # ~0.8 MB/s: the kill lands in the middle of the weights
    part = tmp_path / "models" / "Qwen" / "Qwen3.5-Tiny" / f"{WEIGHTS}.part"
    child = subprocess.Popen([sys.executable, "-c", DOWNLOADER, str(tmp_path), hub.url], cwd=ROOT,
                             env={**os.environ, "QT_QPA_PLATFORM": "offscreen"}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (part.is_file() and part.stat().st_size > 200_000):
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "the download did not start"
            time.sleep(0.02)
        kill9(child)
    finally:
        child.kill()
    left = part.stat().st_size
    assert 0 < left < len(hub.repos[REPO][WEIGHTS])

    hub.delay = 0.0
    store = Store(tmp_path / "qwendesk.sqlite3")
    manager = DownloadManager(store, tmp_path / "models", endpoint=hub.url, chunk_size=8192, autostart=False)
    assert manager.status(REPO).state == "paused"       # the killed run is remembered, to resume
    with qtbot.waitSignal(manager.completed, timeout=30_000) as done:
        manager.resume(REPO)
    ranges = hub.file_gets(WEIGHTS)
    assert ranges[0] is None and ranges[-1] == f"bytes={left}-"          # on from the partial file's end
    assert files_match(hub, Path(done.args[1])) and not part.exists()
    manager.shutdown()
    store.close()
    hub.stop()

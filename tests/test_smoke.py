"""The packaged app's smoke run (app/smoke.py, driven by installer/smoke.py) against this environment's app:
the same script the packaging tests run against the frozen app and the AppDir (tests/test_packaging.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_app_loads_chats_serves_and_quits(tmp_path):
    done = subprocess.run([sys.executable, "-m", "installer.smoke", "--work", str(tmp_path), "--timeout", "300"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])["runs"][0]
    assert run["exit_code"] == 0 and run["device"] == "cpu" and run["chat_output_tokens"] >= 1
    assert run["sdk"]["completion_tokens"] >= 1
    events = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events == ["window", "loaded", "toolchain", "reply", "endpoint", "quit"]

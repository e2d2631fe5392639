"""The smoke test of a built app, the same for the development environment, the frozen app and the AppDir:

    python -m installer.smoke                                   # the app of this environment (python -m app)
    python -m installer.smoke --app dist/qwendesk/qwendesk      # the frozen app (or an AppDir's AppRun)
        [--wheels FOLDER --runtime-dir FOLDER]                  # its first launch installs torch from FOLDER

It writes a tiny checkpoint, starts the app offscreen with QWENDESK_SMOKE (app/smoke.py drives the real window:
load, one chat turn, the local endpoint), sends one OpenAI SDK request to that endpoint, asks the app to quit
and checks that it exits cleanly. Prints one JSON line of timings; exit code 0 when every step passed.
Runs from the repository's root (it uses tests/fixtures and the openai package of the test extras).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXIT_TIMEOUT_S = 60


def read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def wait_for(events_path: Path, process: subprocess.Popen, event: str, timeout: float) -> list[dict]:
    """The events so far, once `event` (or a failure) is among them; AssertionError on exit or time-out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = read_events(events_path)
        names = [e["event"] for e in events]
        if "failed" in names:
            raise AssertionError(f"the app reported: {events[names.index('failed')]['message']}")
        if event in names:
            return events
        if process.poll() is not None:
            raise AssertionError(f"the app exited ({process.returncode}) before '{event}'")
        time.sleep(0.05)
    raise AssertionError(f"no '{event}' within {timeout:.0f} s")


def ask_endpoint(base_url: str, model: str) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", timeout=120)
    reply = client.chat.completions.create(model=model, max_tokens=8, temperature=0.0,
                                           messages=[{"role": "user", "content": "Hello from the SDK"}])
    assert reply.choices and reply.usage.completion_tokens >= 1, f"an empty reply: {reply}"
    return {"finish_reason": reply.choices[0].finish_reason, "completion_tokens": reply.usage.completion_tokens}


def run_smoke(app: list[str], folder: Path, env: dict, timeout: float) -> dict:
    """One smoke run of `app` in `folder` (which holds the checkpoint); its measures."""
    events_path = folder / "events.jsonl"
    events_path.unlink(missing_ok=True)
    (folder / "quit").unlink(missing_ok=True)
    log = (folder / "app.log").open("w")
    started = time.time()
    process = subprocess.Popen(app, env=dict(env, QWENDESK_SMOKE=str(folder)), stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    try:
        events = wait_for(events_path, process, "endpoint", timeout)
        at = {e["event"]: e for e in events}
        sdk = ask_endpoint(at["endpoint"]["base_url"], at["endpoint"]["model"])
        (folder / "quit").touch()
        code = process.wait(EXIT_TIMEOUT_S)
    except BaseException:
        process.kill()
        process.wait()
        log.close()
        sys.stderr.write((folder / "app.log").read_text(errors="replace")[-4000:])
        raise
    log.close()
    assert code == 0, f"the app exited with {code}: {(folder / 'app.log').read_text(errors='replace')[-2000:]}"
    assert "quit" in [e["event"] for e in read_events(events_path)], "the app exited without its quit event"
    return {"launch_to_window_s": round(at["window"]["time"] - started, 2),
            "model_load_s": at["loaded"]["seconds"], "max_gui_stall_during_load_ms": at["loaded"]["max_stall_ms"],
            "device": at["loaded"]["device"], "stub_build_s": at["toolchain"]["seconds"],
            "chat_output_tokens": at["reply"]["output_tokens"], "sdk": sdk,
            "total_s": round(time.time() - started, 2), "exit_code": code}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", help="the app's executable (default: this Python's `-m app`)")
    parser.add_argument("--wheels", help="a local wheel folder for the first launch's runtime install (offline)")
    parser.add_argument("--runtime-dir", help="where the frozen app keeps its runtime (default: a temporary folder)")
    parser.add_argument("--runs", type=int, default=1, help="launches in a row (the first may install the runtime)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for a launch to reach the endpoint")
    parser.add_argument("--work", help="a folder for the checkpoint and the runs (default: a temporary one)")
    args = parser.parse_args(argv)

    from tests.fixtures.checkpoints import write_checkpoint

    folder = Path(args.work or tempfile.mkdtemp(prefix="qwendesk-smoke-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "checkpoint" / "config.json").is_file():
        write_checkpoint(folder / "checkpoint", "base")
    app = [str(Path(args.app).resolve())] if args.app else [sys.executable, "-m", "app"]
    env = dict(os.environ, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
               QWENDESK_RUNTIME_DIR=str(Path(args.runtime_dir or folder / "runtime").resolve()))
    if args.wheels:
        env["QWENDESK_WHEELS"] = str(Path(args.wheels).resolve())
    env.pop("TRITON_INTERPRET", None)
    results = []
    for _ in range(args.runs):
        results.append(run_smoke(app, folder, env, args.timeout))
    print(json.dumps({"app": " ".join(app), "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

import subprocess
import sys


def test_chat_cli_streams_a_reply(checkpoint):
    path = checkpoint("base")
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", "--model", str(path), "--device", "cpu", "--max-tokens", "12",
         "--seed", "1"],
        input="Hello there\nAnd again\n\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ready" in proc.stderr
    replies = [line for line in proc.stdout.split("> ") if line.strip()]
    assert len(replies) == 2  # one streamed reply per user turn


def test_chat_cli_reports_a_bad_checkpoint(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "--model", str(tmp_path), "--device", "cpu"],
                          input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "error:" in proc.stderr and "config.json" in proc.stderr

"""The command lines: a chat session, and bad arguments refused while parsing (exit 2, one error line on
stderr, no model loaded) by qwendesk-chat, qwendesk-serve, qwendesk, qwendesk-bench and qwendesk_kernels.bench."""

import io
import subprocess
import sys

import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError

import engine.api
from app.main import main as app_main
from engine.bench.suite import main as bench_main
from engine.commands.chat import chat_main
from engine.server.cli import parse_args as serve_args
from qwendesk_kernels.bench import main as kernels_bench_main

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a CUDA GPU")


def test_chat_cli_streams_a_reply(checkpoint):
    path = checkpoint("base")
    proc = subprocess.run(
        [sys.executable, "-m", "engine.commands.chat", "--model", str(path), "--device", "cpu", "--max-tokens", "12",
         "--seed", "1"],
        input="Hello there\nAnd again\n\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ready" in proc.stderr
    replies = [line for line in proc.stdout.split("> ") if line.strip()]
    assert len(replies) == 2  # one streamed reply per user turn


def test_chat_cli_reports_a_checkpoint_that_fails_to_load(tmp_path, checkpoint):
    for f in checkpoint("base").iterdir():                                       # all but the weights
        if f.suffix != ".safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "engine.commands.chat", "--model", str(tmp_path), "--device", "cpu"],
                          input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("error:") and "safetensors" in proc.stderr


@pytest.fixture
def no_load(monkeypatch):
    """A refusal must come before any model loads: loading fails the test."""
    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(engine.api, "Engine", load)


def refusal(capsys, run, argv) -> str:
    """Run a command line that must refuse `argv`; its one error line."""
    with pytest.raises(SystemExit) as exit_:
        run(argv)
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1
    return errors[0]


@pytest.mark.parametrize("args, message", [
    (["--max-tokens", "-5"], "max_tokens must be at least 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--device", "tpu"], "device must be auto, cuda, cpu or cuda:N, not 'tpu'"),
    (["--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
])
def test_chat_refuses_bad_settings(capsys, checkpoint, no_load, args, message):
    line = refusal(capsys, chat_main, ["--model", str(checkpoint("base")), *args])
    assert line.startswith("qwendesk-chat: error:") and message in line


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "argument --port: a port is between 1 and 65535, not 70000"),
    (["--port", "0"], "argument --port: a port is between 1 and 65535, not 0"),
    (["--port", "http"], "argument --port: 'http' is not a port number"),
    (["--max-context", "0"], "max_context must be at least 1 token, not 0"),
    (["--max-queue", "-1"], "max_queue must be >= 0, not -1"),
    (["--device", "tpu"], "device must be auto, cuda, cpu or cuda:N, not 'tpu'"),
    (["--device", "cuda:first"], "not 'cuda:first'"),
    (["--profile", "C3"], "argument --profile: invalid choice: 'C3'"),
    (["--kv-dtype", "fp8"], "argument --kv-dtype: invalid choice: 'fp8'"),
    (["--dtype", "half"], "argument --dtype: invalid choice: 'half'"),
    (["--max-body-mb", "0"], "argument --max-body-mb: must be more than 0"),
    (["--disk-cache", "--host-cache-gb", "0"], "disk_cache reads through the host tier"),
    (["--disk-cache-gb", "-2"], "disk_cache_gb must be > 0, not -2.0"),
])
def test_serve_refuses_bad_settings(capsys, checkpoint, args, message):
    line = refusal(capsys, serve_args, ["--model", str(checkpoint("base")), *args])
    assert line.startswith("qwendesk-serve: error:") and message in line


def test_serve_takes_good_settings(checkpoint):
    args, config = serve_args(["--model", str(checkpoint("base")), "--port", "65535", "--device", "cuda:1",
                               "--profile", "C4", "--kv-dtype", "int8", "--max-context", "1"])
    assert (args.port, config.device, config.max_running, config.kv_dtype, config.max_context) == \
        (65535, "cuda:1", 4, "int8", 1)
    assert not config.disk_cache and config.host_cache_gb is None
    _, config = serve_args(["--model", str(checkpoint("base")), "--disk-cache", "--disk-cache-gb", "5",
                            "--disk-cache-dir", "/tmp/kv", "--host-cache-gb", "2"])
    assert (config.disk_cache, config.disk_cache_gb, config.disk_cache_dir, config.host_cache_gb) == \
        (True, 5.0, "/tmp/kv", 2.0)


@pytest.mark.parametrize("run", [chat_main, serve_args], ids=["chat", "serve"])
def test_a_model_that_is_not_a_checkpoint_is_refused(capsys, tmp_path, monkeypatch, no_load, run):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"")
    for model, message in [(str(tmp_path / "nowhere"), f"{tmp_path / 'nowhere'} does not exist"),
                           ("./nowhere", "./nowhere does not exist"),
                           ("empty", "no config.json in empty: not a Hugging Face checkpoint directory"),
                           ("weights.bin", "weights.bin is a file; a checkpoint is a directory")]:
        assert refusal(capsys, run, ["--model", model]).endswith(f"argument --model: {message}")


def test_chat_downloads_a_hub_repo_id(capsys, checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # no folder here is called "Qwen"
    asked = []

    def snapshot_download(repo_id):
        asked.append(repo_id)
        return str(checkpoint("base"))

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))       # at once: end of input
    assert chat_main(["--model", "Qwen/Qwen3.5-9B", "--device", "cpu"]) == 0
    assert asked == ["Qwen/Qwen3.5-9B"] and "ready" in capsys.readouterr().err


def test_chat_says_why_a_hub_download_failed(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def snapshot_download(repo_id):
        raise LocalEntryNotFoundError("Got: ConnectError\nPlease check your internet connection and try again.")

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    assert chat_main(["--model", "Qwen/Qwen3.5-9B", "--device", "cpu"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == ("error: Qwen/Qwen3.5-9B is not a directory here, and downloading it from the Hugging Face hub "
                    "failed: Got: ConnectError Please check your internet connection and try again.")


def test_app_help_and_version_do_not_open_a_window(capsys):
    for argv in (["--help"], ["--version"]):
        with pytest.raises(SystemExit) as exit_:
            app_main(argv)
        assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: qwendesk" in out and "qwendesk 0.1.0" in out
    assert refusal(capsys, app_main, ["--bogus"]) == "qwendesk: error: unrecognized arguments: --bogus"


def test_app_help_needs_no_qt():
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.modules['PySide6'] = None; "
                           "from app.main import main; main(['--help'])"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: qwendesk" in proc.stdout, proc.stderr


def test_benches_refuse_bad_arguments(capsys):
    assert "'C3' is not a profile" in refusal(capsys, bench_main, ["--profiles", "C1,C3"])
    assert "--contexts: 'x' is not a whole number" in refusal(capsys, bench_main, ["--contexts", "512,x"])
    assert "--decode-tokens: must be at least 1, not 0" in refusal(capsys, bench_main, ["--decode-tokens", "0"])
    assert "no kernel family 'foo'" in refusal(capsys, kernels_bench_main, ["gdn", "foo"])


@no_gpu
def test_benches_say_they_need_a_gpu(capsys):
    for run, prog in ((bench_main, "qwendesk-bench"), (kernels_bench_main, "python -m qwendesk_kernels.bench")):
        assert refusal(capsys, run, ["--no-hf"] if run is bench_main else []) == \
            f"{prog}: error: needs a CUDA GPU; none is available"


@no_gpu
def test_bench_without_transformers_skips_the_comparison_with_a_note(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)      # as after `make app`: transformers is a test extra
    with pytest.raises(SystemExit):
        bench_main([])
    out = capsys.readouterr().out
    assert out.startswith("note: skipping the comparison with HF transformers (")


@pytest.mark.parametrize("value", ["-1", "6"])
def test_speculative_tokens_out_of_range_is_refused(checkpoint, capsys, value):
    from engine.server.cli import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", str(checkpoint("base")), "--speculative-tokens", value])
    assert e.value.code == 2 and "speculative_tokens must be between 0 and 5" in capsys.readouterr().err


def test_a_refusal_is_its_error_line_and_where_the_options_are(capsys, checkpoint):
    """Issue 47: a refusal printed ~12 lines of usage before the one error line."""
    with pytest.raises(SystemExit):
        serve_args(["--model", str(checkpoint("base")), "--port", "http"])
    assert capsys.readouterr().err.splitlines() == [
        "qwendesk-serve: error: argument --port: 'http' is not a port number",
        "Run qwendesk-serve --help for the options."]


def test_serve_help_shows_the_default_port(capsys):
    with pytest.raises(SystemExit):
        serve_args(["--help"])
    assert f"port to listen on (default {engine.api.DEFAULT_PORT})" in " ".join(capsys.readouterr().out.split())

"""Hugging Face search (issue 47): the app's own client code against a local stand-in of the hub's HTTP API
(tests/app_support.py FakeHub: /api/models search, model info with file sizes, resolve). Each result's config.json
and sizes are read before download; what the engine cannot run is left out with the reason; a result downloads
through the catalog's resumable, verified path and then loads."""

import json
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.downloads.hub_search import search_hub
from tests.app_support import FakeHub, make_context, open_window, page_screenshot, wait_ready


def side_file(directory: Path, name: str, content: dict) -> Path:
    """An older quantizer's side file beside config.json (AutoAWQ's quant_config.json, AutoGPTQ's quantize_config)."""
    (directory / name).write_text(json.dumps(content))
    return directory


def variant(base: Path, target: Path, **config) -> Path:
    """A copy of a checkpoint with its config.json changed (None removes a key)."""
    shutil.copytree(base, target)
    raw = json.loads((target / "config.json").read_text())
    for key, value in config.items():
        raw.pop(key, None) if value is None else raw.__setitem__(key, value)
    (target / "config.json").write_text(json.dumps(raw))
    return target


@pytest.fixture
def hub(checkpoint, tmp_path_factory):
    base, moe = Path(checkpoint("base")), Path(checkpoint("moe"))
    root = tmp_path_factory.mktemp("hub")
    repos = {
        "tester/Qwen3.5-Tiny-Instruct": base,
        "tester/Qwen3.5-Tiny-MoE": moe,
        "tester/Qwen3.5-Tiny-GPTQ": variant(base, root / "gptq", quantization_config={
            "quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "gptq"}),
        "tester/Qwen3.5-Tiny-AWQ-side": side_file(variant(base, root / "awq"), "quant_config.json", {
            "w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"}),
        "tester/Qwen3.5-Tiny-bnb": variant(base, root / "bnb", quantization_config={
            "quant_method": "bitsandbytes", "load_in_4bit": True}),
        "other/Qwen3.5-style-llama": variant(base, root / "llama", model_type="llama",
                                             architectures=["LlamaForCausalLM"]),
        "other/unrelated": base,
        "tester/Qwen3.5<img src=x>": base,              # not a repo id the hub allows: never shown nor fetched
    }
    downloads = {"tester/Qwen3.5-Tiny-MoE": 900, "tester/Qwen3.5-Tiny-Instruct": 500, "tester/Qwen3.5-Tiny-GPTQ": 300,
                 "tester/Qwen3.5-Tiny-AWQ-side": 250, "tester/Qwen3.5-Tiny-bnb": 200, "other/Qwen3.5-style-llama": 100}
    server = FakeHub(repos, downloads)
    yield server
    server.stop()


def test_search_reads_each_result_before_download_and_leaves_out_what_cannot_run(hub):
    result = search_hub("qwen3.5", None, hub.url)
    assert [c.repo_id for c in result.candidates] == [
        "tester/Qwen3.5-Tiny-MoE", "tester/Qwen3.5-Tiny-Instruct", "tester/Qwen3.5-Tiny-GPTQ",
        "tester/Qwen3.5-Tiny-AWQ-side"]
    moe, dense, gptq, awq = result.candidates
    assert moe.architecture.is_moe and not dense.architecture.is_moe
    assert (dense.source_format, gptq.source_format) == ("FP32", "GPTQ int4")          # the tiny checkpoints are fp32
    assert awq.source_format == "AWQ int4"                         # from its side file, read before any download
    assert dense.download_bytes == sum(len(d) for d in hub.repos["tester/Qwen3.5-Tiny-Instruct"].values())
    assert dense.downloads == 500
    assert set(result.left_out) == {"tester/Qwen3.5-Tiny-bnb", "other/Qwen3.5-style-llama"}
    assert not any("img" in p for _, p, _ in hub.requests)
    assert "bitsandbytes" in result.left_out["tester/Qwen3.5-Tiny-bnb"]
    assert "unsupported model_type 'llama'" in result.left_out["other/Qwen3.5-style-llama"]
    gets = [p for m, p, _ in hub.requests if m == "GET"]
    assert "/tester/Qwen3.5-Tiny-Instruct/resolve/main/config.json" in gets
    assert not any(p.endswith(".safetensors") for p in gets)          # nothing downloaded to decide


def test_the_models_page_searches_plans_downloads_and_loads_a_result(app_env, qtbot, hub):
    context = make_context(app_env, hub_endpoint=hub.url)
    window = open_window(qtbot, context, autoload=False)
    page = window.models
    page.search_field.setText("Qwen3.5-Tiny")
    qtbot.mouseClick(page.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(page.search_cards) == 4, timeout=30_000)
    assert "4 checkpoints" in page.search_status.text() and "1 other result left out" in page.search_status.text()
    card = next(c for c in page.search_cards if c.entry.id == "tester/Qwen3.5-Tiny-Instruct")
    assert "Runs as" in card.facts.text() and "tokens of context" in card.facts.text()   # the engine's plan
    page_screenshot(page, "models_hub_search")
    qtbot.mouseClick(card.button, Qt.MouseButton.LeftButton)
    wait_ready(qtbot, window, timeout=60_000)                              # downloaded, verified, then loaded
    assert window.engine.model.path == str(Path(context.models_dir, "tester", "Qwen3.5-Tiny-Instruct"))
    assert window.downloads.status("tester/Qwen3.5-Tiny-Instruct").state == "ready"

"""The app's load path decides the weights with the engine's planner: on a (simulated) 24 GiB card the 27B goes
ahead as int4, the 9B and 0.8B as 16-bit, and a forced setting is obeyed. The checkpoints here are config.json files
describing the real models (no weights: the plan needs none); the engine itself is a stand-in that records what it was
asked to load, since no 27B can load on this machine."""

import json

import pytest

from app.load_state import Phase
from app.paths import resources_dir
from engine.api import DeviceInfo
from tests.app_support import make_context, open_window

GIB = 1 << 30
RTX3090 = DeviceInfo("cuda", "NVIDIA GeForce RTX 3090", 24 * GIB, int(23.5 * GIB))


class StandInEngine:
    """Records the EngineConfig the app built, then stops the load (there are no weights to read)."""
    configs = []
    freeze_gc = []

    def __init__(self, config, progress=None, cancel=None, freeze_gc=True):
        StandInEngine.configs.append(config)
        StandInEngine.freeze_gc.append(freeze_gc)
        raise RuntimeError("stand-in engine: no weights here")


def real_checkpoint(directory, size: str):
    """A checkpoint folder whose config.json describes the published model of `size` (the catalog's architecture,
    inside the multimodal wrapper the official repositories use)."""
    text_config = json.loads((resources_dir() / "catalog.json").read_text())["architectures"][size]
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text_config,
                                                       "architectures": ["Qwen3_5ForConditionalGeneration"]}))
    return directory


@pytest.fixture
def load_on_3090(app_env, qtbot, monkeypatch):
    monkeypatch.setattr("engine.core.memory.probe", lambda name="auto": RTX3090)   # the device the planner sees
    monkeypatch.setattr("app.engine_thread.Engine", StandInEngine)
    StandInEngine.configs.clear()
    StandInEngine.freeze_gc.clear()

    def load(path, **settings):
        window = open_window(qtbot, make_context(app_env, device=RTX3090, **settings), autoload=False)
        stages, failures = [], []
        window.engine.load_progress.connect(lambda load: stages.append(load.stage))
        window.engine.state_changed.connect(
            lambda state: state.phase is Phase.FAILED and failures.append(state.message))
        window.load_model(str(path))
        qtbot.waitUntil(lambda: bool(failures), timeout=20_000)
        return failures[0], stages

    return load


@pytest.mark.parametrize("size, weights", [("27B", "int4"), ("9B", "bf16"), ("0.8B", "bf16")])
def test_auto_weights_on_a_24gib_card(load_on_3090, tmp_path, size, weights):
    failure, stages = load_on_3090(real_checkpoint(tmp_path / size, size))
    assert [c.weights for c in StandInEngine.configs] == [weights]          # the planner's pick reached the engine
    assert StandInEngine.freeze_gc == [False]        # the window collects on its GUI thread, not the engine thread
    assert "stand-in engine" in failure and "does not fit" not in failure   # the load went ahead
    kind = "int4" if weights == "int4" else "16-bit"
    assert any(stage.startswith(f"Loading {kind} weights") for stage in stages), stages


def test_forced_weights_are_obeyed_or_refused_with_what_fits(load_on_3090, tmp_path):
    _, stages = load_on_3090(real_checkpoint(tmp_path / "9B", "9B"), weights="int4")
    assert [c.weights for c in StandInEngine.configs] == ["int4"]
    assert any(stage.startswith("Loading int4 weights") for stage in stages), stages
    StandInEngine.configs.clear()
    failure, _ = load_on_3090(real_checkpoint(tmp_path / "27B", "27B"), weights="bf16")
    assert StandInEngine.configs == []                                          # refused before loading
    assert "does not fit" in failure and "int4" in failure

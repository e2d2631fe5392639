"""Settings: a profile change reloads the engine; the local endpoint serves the OpenAI SDK; a
remote OpenAI-compatible server replaces the local engine for the chat."""

import pytest
from PySide6.QtCore import Qt

from app.load_state import Phase
from tests.app_support import (
    FakeOpenAI,
    make_context,
    open_window,
    page_screenshot,
    screenshot,
    seeded_replies,
    send,
    wait_ready,
    wait_reply,
)


@pytest.fixture
def window(app_env, qtbot, checkpoint, monkeypatch):
    seeded_replies(monkeypatch)
    context = make_context(app_env, last_model=str(checkpoint("base")), max_tokens=16, thinking=False)
    w = open_window(qtbot, context)
    wait_ready(qtbot, w)
    return w


def test_profile_change_reloads_the_engine(window, qtbot):
    page = window.settings_page
    window.show_page("settings")
    assert not page.apply_engine.isEnabled()
    plans = [page.plans.cell_text(row, 2) for row in range(1, 5)]
    weights = {page.plans.cell_text(row, 1) for row in range(1, 5)}
    assert len(weights) == 1 and weights.pop().startswith("32-bit, ")         # the CPU runs unquantized fp32
    assert all(text.endswith("tokens") for text in plans)             # every profile fits the tiny model
    screenshot(window, "settings")
    page.profile_buttons["C2"].click()
    page.kv_dtype.setCurrentIndex(page.kv_dtype.findData("int8"))
    assert page.apply_engine.isEnabled() and "reloads" in page.engine_status.text()
    states = []
    window.engine.state_changed.connect(lambda state: states.append(state.phase))
    qtbot.mouseClick(page.apply_engine, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: states[-1:] == [Phase.LOADED], timeout=30_000)
    assert states == [Phase.LOADING, Phase.LOADED]
    assert window.engine.model.profile == "C2"
    assert window.context.settings.profile == "C2" and window.context.settings.kv_dtype == "int8"
    assert window.context.store.get_setting("app_settings")["profile"] == "C2"
    assert "C2" in window.status.text.full_text
    assert not page.apply_engine.isEnabled()
    send(qtbot, window, "Still there?")
    wait_reply(qtbot, window)
    assert window.chat.transcript.message_views()[-1].message.status == "complete"


def test_generation_defaults_apply_without_a_reload(window, qtbot):
    page = window.settings_page
    states = []
    window.engine.state_changed.connect(lambda state: states.append(state.phase))
    window.models.token.setText("hf_secret")
    window.models.save_token()                          # another page changes another field first
    page.temperature.setValue(0.2)
    page.temperature.editingFinished.emit()
    page.effort.setCurrentIndex(page.effort.findData("medium"))
    assert window.context.settings.temperature == 0.2 and window.context.settings.reasoning_effort == "medium"
    assert window.context.settings.sampling_params(thinking=True).thinking_budget == 4096
    qtbot.wait(100)
    assert states == []
    saved = window.context.store.get_setting("app_settings")
    assert saved["temperature"] == 0.2 and saved["hf_token"] == "hf_secret"
    assert "hf_secret" not in repr(window.context.settings)


def test_endpoint_switch_serves_the_openai_sdk(window, qtbot):
    pytest.importorskip("engine.server", reason="the engine's HTTP server is not in this build")
    openai = pytest.importorskip("openai")
    page = window.settings_page
    page.endpoint_port.setRange(0, 65535)
    page.endpoint_port.setValue(0)                          # any free port
    page.endpoint_key.setText("sk-test")
    page.endpoint_key.editingFinished.emit()
    with qtbot.waitSignal(window.engine.endpoint_changed, timeout=30_000,
                          check_params_cb=lambda status: status.running or bool(status.message)) as started:
        qtbot.mouseClick(page.endpoint_enabled, Qt.MouseButton.LeftButton)      # the switch, clicked
    assert page.endpoint_enabled.isChecked()
    status = started.args[0]
    assert status.running, status.message
    assert page.endpoint_status.text() == f"Running at {status.base_url}"
    window.show_page("settings")
    page_screenshot(page, "settings_full_endpoint_on")
    client = openai.OpenAI(base_url=status.base_url, api_key="sk-test", timeout=60)
    reply = client.chat.completions.create(model=window.engine.model.name, max_tokens=8,
                                           messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=status.base_url, api_key="wrong", timeout=30).models.list()
    qtbot.mouseClick(page.log_view.toggle, Qt.MouseButton.LeftButton)        # the server's log, in the card
    qtbot.waitUntil(lambda: "401" in page.log_view.text.toPlainText(), timeout=5_000)
    log = page.log_view.text.toPlainText()
    assert f"Serving {window.engine.model.name} at {status.base_url}" in log
    assert "POST /v1/chat/completions HTTP/1.1\" 200" in log and "GET /v1/models HTTP/1.1\" 401" in log
    assert "sk-test" not in log
    page.log_view.text.ensureCursorVisible()
    page_screenshot(page, "settings_endpoint_log")
    with qtbot.waitSignal(window.engine.endpoint_changed, timeout=30_000) as stopped:
        page.endpoint_enabled.setChecked(False)
    assert not stopped.args[0].running


def test_endpoint_that_cannot_start_is_a_message(window, qtbot, monkeypatch):
    from app import engine_thread
    from app.endpoint import UNAVAILABLE, EndpointStatus
    monkeypatch.setattr(engine_thread, "start_endpoint",
                        lambda *args: (None, EndpointStatus(False, message=UNAVAILABLE)))
    with qtbot.waitSignal(window.engine.endpoint_changed, timeout=10_000) as changed:
        window.settings_page.endpoint_enabled.setChecked(True)
    assert changed.args[0].message == UNAVAILABLE
    assert window.settings_page.endpoint_status.text() == UNAVAILABLE


def test_remote_server_replaces_the_local_engine(app_env, qtbot):
    server = FakeOpenAI(api_key="remote-key", words=5, delay=0.01)
    try:
        window = open_window(qtbot, make_context(app_env), autoload=False)
        page = window.settings_page
        page.remote_url.setText(server.url + "/v1")
        page.remote_key.setText("remote-key")
        page.test_remote()
        qtbot.waitUntil(lambda: page.remote_status.text().startswith("Connected"), timeout=10_000)
        assert page.remote_model.currentText() == "big-qwen"
        page.remote_enabled.setChecked(True)
        assert window.session.backend is window.remote
        window.show_page("settings")
        page_screenshot(page, "settings_full_remote")
        window.show_page("chat")
        assert "big-qwen" in window.chat.model_badge.text() and not window.chat.composer._blocked_reason
        send(qtbot, window, "Hello, big server")
        wait_reply(qtbot, window)
        (request,) = server.requests
        assert request["model"] == "big-qwen" and request["stream"] is True
        assert request["messages"][-1] == {"role": "user", "content": "Hello, big server"}
        assert request["chat_template_kwargs"] == {"enable_thinking": True}      # the default
        reply = window.chat.transcript.message_views()[-1].message
        assert reply.content == " ".join(f"word{i}" for i in range(5)) and reply.reasoning == "Let me think. "
        assert reply.metrics["prompt_tokens"] == 12 and reply.metrics["cached_tokens"] == 4
        screenshot(window, "chat_remote")
        server.stop()                                   # the server dies: "Connected." must not stay
        send(qtbot, window, "Still there?")
        wait_reply(qtbot, window)
        assert page.remote_status.text().startswith("The last request failed:")
        assert page.remote_status.property("state") == "warning"
    finally:
        server.stop()


def test_remote_errors_reach_the_chat_as_messages(app_env, qtbot):
    server = FakeOpenAI(api_key="right")
    try:
        window = open_window(qtbot, make_context(app_env, remote_enabled=True, remote_base_url=server.url + "/v1",
                                                 remote_api_key="wrong", remote_model="m"), autoload=False)
        send(qtbot, window, "Hello?")
        wait_reply(qtbot, window)
        reply = window.chat.transcript.message_views()[-1]
        assert reply.message.status == "error" and "401" in reply.message.error
        assert reply.error.isVisible()
    finally:
        server.stop()


def test_speculation_setting_reaches_the_engine_config(app_env, qtbot):
    """Automatic by default (3 drafts on a GPU, off on the CPU); a choice is kept and handed to the engine."""
    from app.settings import AppSettings
    window = open_window(qtbot, make_context(app_env), autoload=False)
    page = window.settings_page
    assert page.speculation.currentData() == "auto" and page.speculation.isEnabled()
    assert page.edited_settings().speculative_tokens is None
    page.speculation.setCurrentIndex(page.speculation.findData(0))
    assert page.edited_settings().speculative_tokens == 0
    page.speculation.setCurrentIndex(page.speculation.findData(5))
    page.apply_engine_settings()
    assert window.context.settings.speculative_tokens == 5
    assert AppSettings.load(window.context.store).engine_config("x").speculative_tokens == 5


def test_a_block_drafter_is_set_per_model_and_reaches_the_engine(window, qtbot, checkpoint, tmp_path):
    """Settings → Block drafter: a folder made for another model is refused in one line and not kept; the model's
    own drafter is kept for that model only, and the engine reloads drafting with it; the chat still answers."""
    import json

    from tests.fixtures.drafters import write_drafter
    page = window.settings_page
    window.show_page("settings")
    base = str(checkpoint("base"))
    assert page.model_path == base and page.drafter_path.text() == "" and page.drafter_note.text() == ""
    other = write_drafter(tmp_path / "other", base)
    (other / "config.json").write_text(json.dumps({**json.loads((other / "config.json").read_text()),
                                                   "hidden_size": 48}))
    page.drafter_path.setText(str(other))
    assert "hidden size 48" in page.drafter_note.text() and page.drafter_note.objectName() == "errorNote"
    assert page.edited_settings().drafters == {}
    assert page.draft_method.currentData() == "auto" and page.draft_method.findData("dflash") == -1
    drafter = write_drafter(tmp_path / "mine", base)
    page.drafter_path.setText(str(drafter))
    page.speculation.setCurrentIndex(page.speculation.findData(3))
    assert page.drafter_note.objectName() == "muted"
    assert page.edited_settings().drafters == {base: str(drafter)}
    page_screenshot(page, "settings_drafter")
    states = []
    window.engine.state_changed.connect(lambda state: states.append(state.phase))
    qtbot.mouseClick(page.apply_engine, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: states[-1:] == [Phase.LOADED], timeout=30_000)
    assert window.engine.model.plan.method == "dflash" and window.engine.model.plan.drafts == 3
    assert window.context.settings.drafters == {base: str(drafter)}
    assert window.context.settings.engine_config("another").drafter is None
    send(qtbot, window, "Still there?")
    wait_reply(qtbot, window)
    assert window.chat.transcript.message_views()[-1].message.status == "complete"


def test_engine_settings_start_from_the_engines_defaults_and_reach_its_config():
    """An app setting named as an EngineConfig field starts at the engine's default and reaches engine_config: a new
    engine setting is one line in AppSettings (here, `vision` in a subclass)."""
    from dataclasses import dataclass, fields

    from app.settings import RELOAD_FIELDS, AppSettings, default_of
    from engine.api import EngineConfig

    engine_defaults = {f.name: f.default for f in fields(EngineConfig)}
    assert RELOAD_FIELDS == {"device", "weights", "profile", "kv_dtype", "max_context", "speculative_tokens",
                             "speculation", "drafters"}
    for name in RELOAD_FIELDS - {"drafters"}:
        assert getattr(AppSettings(), name) == engine_defaults[name], name
    chosen = dict(device="cpu", weights="int4", profile="C4", kv_dtype="int8", max_context=4096, speculative_tokens=2)
    config = AppSettings(**chosen).engine_config("m")
    assert {name: getattr(config, name) for name in chosen} == chosen and config.model == "m" and config.disk_cache

    @dataclass
    class WithVision(AppSettings):
        vision: str = default_of(EngineConfig, "vision")

    assert WithVision().engine_config("m").vision == engine_defaults["vision"]
    assert WithVision(vision="off").engine_config("m").vision == "off"


def test_settings_without_a_model_show_each_profiles_memory_and_no_reload_warning(app_env, qtbot, checkpoint):
    context = make_context(app_env, last_model=str(checkpoint("base")))
    w = open_window(qtbot, context, autoload=False)
    page = w.settings_page
    w.show_page("settings")
    headers = [page.plans.cell_text(0, col) for col in range(7)]
    assert headers[1:6] == ["Weights", "Context each", "KV cache", "State", "Workspace"]
    kv = [page.plans.cell_text(row, 3) for row in range(1, 5)]
    state = [page.plans.cell_text(row, 4) for row in range(1, 5)]
    assert all(text.endswith("iB") for text in kv + state)
    assert len(set(state)) > 1                           # more requests together: more recurrent state each
    page.profile_buttons["C2"].click()
    assert page.apply_engine.isEnabled() and page.apply_engine.text() == "Apply"
    assert "reload" not in page.engine_status.text() and "when a model loads" in page.engine_status.text()
    page_screenshot(page, "settings_no_model")


def test_special_tokens_setting_reaches_the_endpoint(window, qtbot):
    """Settings → Local endpoint → Special tokens: as control tokens a client's "<|im_start|>" is one token of the
    prompt (it could forge a turn), as plain text several."""
    pytest.importorskip("engine.server", reason="the engine's HTTP server is not in this build")
    import json
    import urllib.request

    page = window.settings_page
    page.endpoint_port.setRange(0, 65535)
    page.endpoint_port.setValue(0)
    page.endpoint_port.editingFinished.emit()

    def prompt_tokens(mode: str) -> int:
        page.special_tokens.setCurrentIndex(page.special_tokens.findData(mode))
        assert window.context.settings.endpoint_special_tokens == mode
        with qtbot.waitSignal(window.engine.endpoint_changed, timeout=30_000,
                              check_params_cb=lambda status: status.running or bool(status.message)) as started:
            page.endpoint_enabled.setChecked(True)
        status = started.args[0]
        assert status.running, status.message
        body = {"model": window.engine.model.name, "messages": [{"role": "user", "content": "a<|im_start|>b"}]}
        request = urllib.request.Request(status.base_url.removesuffix("/v1") + "/tokenize", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            count = json.load(r)["count"]
        with qtbot.waitSignal(window.engine.endpoint_changed, timeout=30_000):
            page.endpoint_enabled.setChecked(False)
        return count

    control = prompt_tokens("control")
    text = prompt_tokens("text")
    assert text > control
    assert window.context.store.get_setting("app_settings")["endpoint_special_tokens"] == "text"
    window.show_page("settings")
    page_screenshot(page, "settings_endpoint_special_tokens")

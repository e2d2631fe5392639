"""A conversation's own system prompt and sampling, and the presets they are picked from."""

import pytest

from app.chat import presets
from app.chat.chat_options import ChatOptionsDialog
from app.settings import AppSettings
from app.store import Store
from tests.app_support import ScriptedBackend, make_context, open_window, screenshot, send, wait_reply


class RecordingBackend(ScriptedBackend):
    def __init__(self):
        super().__init__([("Arr.", "")])
        self.requests = []

    def generate(self, request_id, messages, params, template_kwargs):
        self.requests.append((messages, params))
        super().generate(request_id, messages, params, template_kwargs)


def test_presets_kept_in_the_store(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    defaults = AppSettings()
    assert presets.overrides({"temperature": 0.2, "top_p": defaults.top_p, "seed": 1}, defaults) == {"temperature": 0.2}
    assert presets.apply_overrides(defaults, {"temperature": 0.2, "bogus": 1}).temperature == 0.2
    saved = presets.Presets(store)
    saved.save("Poems", {"temperature": 1.1, "top_p": 0.9, "other": 3})
    assert saved.all()["Poems"] == {"temperature": 1.1, "top_p": 0.9}
    assert set(presets.BUILT_IN) < set(saved.all())
    with pytest.raises(ValueError, match="built-in"):
        saved.save("Precise", {"temperature": 1.0})
    saved.delete("Poems")
    assert "Poems" not in saved.all()
    store.close()


def test_a_chat_with_its_own_system_prompt_and_sampling(app_env, qtbot, monkeypatch):
    window = open_window(qtbot, make_context(app_env, system_prompt="Be brief."), autoload=False)
    backend = RecordingBackend()
    window.session.set_backend(backend)
    window.chat.set_model("Scripted")
    window.show_page("chat")
    store = window.context.store
    window.session.presets.save("Pirate", {"temperature": 1.3, "top_k": 40})

    def fill(dialog):
        dialog.system_prompt.setPlainText("You are a pirate.")
        dialog.preset.setCurrentText("Pirate")
        dialog._apply_preset()
        assert dialog.delete_preset.isEnabled()
        dialog.show()
        screenshot(dialog, "chat_options_dialog")
        return 1

    monkeypatch.setattr(ChatOptionsDialog, "exec", fill)
    qtbot.mouseClick(window.chat.options_button, __import__("PySide6.QtCore").QtCore.Qt.MouseButton.LeftButton)
    assert window.chat.options_button.isChecked()
    send(qtbot, window, "Where is the treasure?")             # a new chat keeps what was set before it was saved
    wait_reply(qtbot, window)
    messages, params = backend.requests[-1]
    assert messages[0] == {"role": "system", "content": "You are a pirate."}
    assert (params.temperature, params.top_k, params.top_p) == (1.3, 40, AppSettings().top_p)
    assert store.conversation(window.session.current.id).options == {
        "system_prompt": "You are a pirate.", "sampling": {"temperature": 1.3, "top_k": 40}}
    window.chat.banner.clear()
    screenshot(window, "chat_with_own_settings")
    window.session.new_conversation()
    assert not window.chat.options_button.isChecked()
    send(qtbot, window, "And now?")
    wait_reply(qtbot, window)
    messages, params = backend.requests[-1]
    assert messages[0]["content"] == "Be brief." and params.temperature == AppSettings().temperature

"""Exporting a conversation (Markdown, JSON) and importing the JSON back, images and versions included."""

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage

from app.chat import export
from app.chat.attachments import keep_image
from app.store import Store
from tests.app_support import make_context, open_window, screenshot


def a_conversation(store, image_path):
    conversation = store.create_conversation("Colours: what/why?")
    store.set_conversation_options(conversation.id, {"system_prompt": "Answer in one line.",
                                                     "sampling": {"temperature": 0.3}})
    conversation = store.conversation(conversation.id)
    store.add_message(conversation.id, "user", content="What colour is this?", attachments=[image_path])
    reply = store.add_message(conversation.id, "assistant", content="Red.", reasoning="The pixels are red.",
                              metrics={"output_tokens": 2}, tool_calls=[{"name": "lookup", "arguments": {"q": "red"}}])
    store.new_version(reply.id)
    store.update_message(reply.id, content="It is red.", status="complete")
    store.add_message(conversation.id, "notice", content="A note.")
    return conversation


def test_markdown_and_json_round_trip(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    image = tmp_path / "red.png"
    picture = QImage(8, 8, QImage.Format.Format_RGB32)
    picture.fill(QColor("red"))
    picture.save(str(image))
    conversation = a_conversation(store, str(image))
    reply_id = store.messages(conversation.id)[1].id
    store.show_version(reply_id, 0)                   # Markdown holds the versions shown
    text = export.to_markdown(conversation, store.messages(conversation.id), "Qwen")
    assert text.startswith("# Colours: what/why?\n")
    assert "## System\n\nAnswer in one line." in text and "## You\n\n![image](file://" in text
    assert "## Qwen\n\n> **Thinking**" in text and "Red." in text and '"q": "red"' in text and "It is red" not in text
    store.show_version(reply_id, 1)
    messages = store.messages(conversation.id)
    assert export.safe_file_name(conversation.title) == "Colours  what why"
    data = json.loads(json.dumps(export.to_json(conversation, messages)))
    kept = {}

    def keep(data, suffix):
        path = tmp_path / f"kept{len(kept)}{suffix}"
        path.write_bytes(data)
        kept[str(path)] = data
        return str(path)

    copy = export.import_json(store, data, keep)
    assert copy.id != conversation.id and copy.title == conversation.title and copy.options == conversation.options
    again = store.messages(copy.id)
    assert [m.role for m in again] == ["user", "assistant", "notice"]
    assert list(kept.values()) == [image.read_bytes()] and again[0].attachments == list(kept)
    assert (again[1].content, again[1].version, again[1].versions[0]["content"]) == ("It is red.", 1, "Red.")
    assert again[1].tool_calls == []
    assert again[1].versions[0]["tool_calls"] == [{"name": "lookup", "arguments": {"q": "red"}}]


@pytest.mark.parametrize("data, why", [
    ([], "not a conversation"),
    ({"format": "qwendesk.conversation", "version": 9, "title": "x", "messages": []}, "version 9"),
    ({"format": "qwendesk.conversation", "version": 1, "title": "x", "messages": [{"role": "system"}]}, "Message 1"),
    ({"format": "qwendesk.conversation", "version": 1, "title": "x",
      "messages": [{"role": "user", "content": 3}]}, "content"),
    ({"format": "qwendesk.conversation", "version": 1, "title": "x",
      "messages": [{"role": "assistant", "versions": [{"id": 4}]}]}, "versions"),
    ({"format": "qwendesk.conversation", "version": 1, "title": "x",
      "messages": [{"role": "user", "images": [{"suffix": ".exe", "data": ""}]}]}, "images"),
])
def test_a_bad_file_is_refused_and_nothing_stored(tmp_path, data, why):
    store = Store(tmp_path / "db.sqlite3")
    with pytest.raises(ValueError, match=why):
        export.import_json(store, data, lambda *a: pytest.fail("no image is kept"))
    assert store.conversations() == []


def test_export_and_import_from_the_list(app_env, qtbot, monkeypatch, tmp_path):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.show_page("chat")
    store = window.context.store
    picture = QImage(8, 8, QImage.Format.Format_RGB32)
    picture.fill(QColor("blue"))
    conversation = a_conversation(store, keep_image(picture))
    window.chat.refresh_conversations()
    target = tmp_path / "out.json"
    monkeypatch.setattr("app.dialogs.save_path", lambda parent, title, suggested, f: str(target))
    window.chat.conversations.export_requested.emit(conversation.id, "json")    # the row's menu
    assert json.loads(target.read_text())["title"] == conversation.title
    monkeypatch.setattr("app.dialogs.open_path", lambda *a: str(target))
    qtbot.mouseClick(window.chat.conversations.import_button, Qt.MouseButton.LeftButton)
    assert len(store.conversations()) == 2 and window.session.current.id != conversation.id
    assert [v.message.role for v in window.chat.transcript.message_views()] == ["user", "assistant"]
    target.write_text("{not json")
    qtbot.mouseClick(window.chat.conversations.import_button, Qt.MouseButton.LeftButton)
    assert window.chat.banner.isVisible() and "Could not read out.json" in window.chat.banner.latest().text.text()
    assert len(store.conversations()) == 2
    screenshot(window, "chat_import_refused")

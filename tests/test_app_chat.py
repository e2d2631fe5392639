"""The chat through the real engine thread and a tiny checkpoint on the CPU (random replies)."""

import hashlib
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, Qt, QUrl
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication, QToolButton

from app.store import Store
from tests.app_support import (
    ScriptedBackend,
    make_context,
    open_window,
    screenshot,
    seeded_replies,
    send,
    wait_ready,
    wait_reply,
)


def loaded_window(app_env, qtbot, path, max_tokens: int):
    """The app with the tiny checkpoint at `path` loaded, thinking off."""
    context = make_context(app_env, last_model=str(path), max_tokens=max_tokens, thinking=False,
                           model_folders=[str(Path(path).parent)])
    window = open_window(qtbot, context)
    wait_ready(qtbot, window)
    return window


@pytest.fixture
def chat_window(app_env, qtbot, checkpoint, monkeypatch):
    seeded_replies(monkeypatch)
    return loaded_window(app_env, qtbot, checkpoint("base"), max_tokens=24)


def assistant_messages(window):
    return [m for m in window.context.store.messages(window.session.current.id) if m.role == "assistant"]


def test_send_streams_a_reply_from_the_engine(chat_window, qtbot):
    window = chat_window
    assert window.current_page == "chat"
    deltas = []      # the engine's stream, piece by piece (the window's refresh may coalesce them all)
    window.session.backend.delta.connect(lambda _id, text, reasoning, tokens: deltas.append((text, reasoning)))
    send(qtbot, window, "Hello there")
    assert window.chat.composer.streaming or not window.session.busy
    wait_reply(qtbot, window)
    (reply,) = assistant_messages(window)
    assert reply.status == "complete"
    assert reply.metrics["prompt_tokens"] > 0 and reply.metrics["output_tokens"] > 0
    assert len(deltas) > 1, "the reply streamed"
    assert reply.content.startswith("".join(text for text, _ in deltas).strip())
    views = window.chat.transcript.message_views()
    assert [v.message.role for v in views] == ["user", "assistant"]
    assert "prompt" in views[1].metrics.text() and "output" in views[1].metrics.text()
    assert window.chat.gauge.total == window.engine.max_context and window.chat.gauge.used > 0
    assert len(window.chat.conversations.items()) == 1
    assert window.chat.title.full_text == "Hello there"
    screenshot(window, "chat_reply_tiny_model")
    window.chat._fill_model_menu()
    actions = [(a.text(), a.isChecked()) for a in window.chat.model_menu.actions() if not a.isSeparator()]
    assert actions == [("base", True), ("Eject base", False), ("Download or manage models…", False)]


def test_shift_enter_is_a_new_line_and_enter_sends(chat_window, qtbot):
    composer = chat_window.chat.composer
    qtbot.keyClicks(composer.input, "first line")
    qtbot.keyClick(composer.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer.input, "second line")
    assert composer.input.toPlainText() == "first line\nsecond line" and not chat_window.session.busy
    with qtbot.waitSignal(composer.send_requested) as sent:
        qtbot.keyClick(composer.input, Qt.Key.Key_Return)
    assert sent.args == ["first line\nsecond line", []] and composer.input.toPlainText() == ""
    wait_reply(qtbot, chat_window)


def test_stop_mid_stream_keeps_the_partial_reply(chat_window, qtbot, monkeypatch):
    window = chat_window
    seeded_replies(monkeypatch, max_tokens=3000)
    send(qtbot, window, "Tell me a long story")
    qtbot.waitUntil(lambda: bool(window.session.active and window.session.active.content), timeout=20_000)
    assert window.chat.composer.streaming
    qtbot.mouseClick(window.chat.composer.send_button, Qt.MouseButton.LeftButton)   # the Stop button
    wait_reply(qtbot, window)
    send(qtbot, window, "And another one")
    qtbot.waitUntil(lambda: bool(window.session.active and window.session.active.content), timeout=20_000)
    qtbot.keyClick(window.chat.composer.input, Qt.Key.Key_Escape)                   # Esc stops too
    wait_reply(qtbot, window)
    replies = assistant_messages(window)
    assert [r.status for r in replies] == ["stopped", "stopped"] and all(r.content for r in replies)
    assert all(r.metrics["output_tokens"] < 3000 for r in replies)
    assert not window.chat.composer.streaming
    assert "stopped" in window.chat.transcript.message_views()[-1].metrics.text()


def test_reasoning_is_shown_folded(app_env, qtbot, checkpoint, monkeypatch):
    seeded_replies(monkeypatch)          # seed 3's random reply thinks, then answers
    context = make_context(app_env, last_model=str(checkpoint("base")), max_tokens=30, thinking=True,
                           reasoning_effort="low")
    window = open_window(qtbot, context)
    wait_ready(qtbot, window)
    assert window.chat.composer.think_button.isChecked()
    send(qtbot, window, "Think first, then answer")
    wait_reply(qtbot, window)
    (reply,) = assistant_messages(window)
    assert reply.reasoning and reply.metrics["reasoning_tokens"] > 0
    view = window.chat.transcript.message_views()[-1]
    assert view.thinking.isVisible() and not view.thinking.is_open and view.thinking.body.isHidden()
    screenshot(window, "chat_thinking_folded")
    qtbot.mouseClick(view.thinking.toggle, Qt.MouseButton.LeftButton)
    assert view.thinking.is_open and view.thinking.body.isVisible()
    assert view.thinking.body.text() == reply.reasoning.strip()
    screenshot(window, "chat_thinking_open")


def test_regenerate_keeps_versions(chat_window, qtbot):
    window = chat_window
    send(qtbot, window, "First question")
    wait_reply(qtbot, window)
    (first,) = assistant_messages(window)
    view = window.chat.transcript.message_views()[-1]
    assert view.regenerate_button.isVisible() and not view.versions.isVisible()
    qtbot.mouseClick(view.regenerate_button, Qt.MouseButton.LeftButton)
    wait_reply(qtbot, window)
    (second,) = assistant_messages(window)
    assert second.id == first.id and second.status == "complete" and (second.version, second.version_count) == (1, 2)
    assert second.versions[0]["content"] == first.content and second.versions[0]["metrics"] == first.metrics
    assert view.versions.isVisible() and view.versions.label.text() == "2/2"
    assert not view.versions.next.isEnabled() and view.versions.previous.isEnabled()
    screenshot(window, "chat_reply_versions")
    qtbot.mouseClick(view.versions.previous, Qt.MouseButton.LeftButton)
    (shown,) = assistant_messages(window)
    assert (shown.content, shown.version) == (first.content, 0) and shown.versions[0]["content"] == second.content
    assert view.versions.label.text() == "1/2" and view.message.content == first.content
    history = window.session._history()
    assert history[-1]["content"] == first.content        # the conversation goes on from the version shown


def test_edit_and_resend_the_last_user_message(chat_window, qtbot):
    window = chat_window
    send(qtbot, window, "Wrong question")
    wait_reply(qtbot, window)
    user_view = window.chat.transcript.message_views()[0]
    qtbot.mouseClick(user_view.edit_button, Qt.MouseButton.LeftButton)
    composer = window.chat.composer
    assert composer.editing and composer.input.toPlainText() == "Wrong question"
    screenshot(window, "chat_editing")
    send(qtbot, window, "Right question")
    wait_reply(qtbot, window)
    messages = window.context.store.messages(window.session.current.id)
    assert (messages[0].role, messages[0].content) == ("user", "Right question")
    assert [m.role for m in messages] == ["user", "assistant"]
    assert not composer.editing


def test_conversation_survives_a_restart(app_env, qtbot, checkpoint):
    path = str(checkpoint("base"))
    first = open_window(qtbot, make_context(app_env, last_model=path, max_tokens=16, thinking=False))
    wait_ready(qtbot, first)
    send(qtbot, first, "Remember me")
    wait_reply(qtbot, first)
    reply = first.chat.transcript.message_views()[-1].message.content
    first.close()
    first.context.store.close()

    second = open_window(qtbot, make_context(app_env))
    wait_ready(qtbot, second)
    (item,) = second.chat.conversations.items()
    assert item.text() == "Remember me"
    qtbot.mouseClick(second.chat.conversations.list.viewport(), Qt.MouseButton.LeftButton,
                     pos=second.chat.conversations.list.visualItemRect(item).center())
    views = second.chat.transcript.message_views()
    assert [v.message.content for v in views] == ["Remember me", reply]


def test_interrupted_reply_is_recovered_after_a_crash(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    conversation = store.create_conversation("Crash")
    store.add_message(conversation.id, "assistant", content="half a rep", status="streaming")
    store.db.close()                                   # the app died mid-reply
    (message,) = Store(tmp_path / "db.sqlite3").messages(conversation.id)
    assert message.status == "stopped" and message.content == "half a rep"


def test_conversations_search_rename_and_delete(chat_window, qtbot, monkeypatch):
    window = chat_window
    for text in ("Apples and pears", "Bananas"):
        window.session.new_conversation()
        send(qtbot, window, text)
        wait_reply(qtbot, window)
    listing = window.chat.conversations
    assert len(listing.items()) == 2 and listing.list.item(0).text() == "Today"
    listing.search.setText("pear")
    assert [item.text() for item in listing.items()] == ["Apples and pears"]
    listing.search.setText("")
    apples = next(c for c in window.context.store.conversations() if c.title.startswith("Apples"))
    item = next(item for item in listing.items() if item.text().startswith("Apples"))
    item.setText("Fruit")                                # what an inline edit does
    assert window.context.store.conversation(apples.id).title == "Fruit"
    monkeypatch.setattr("app.dialogs.confirm", lambda *args: True)
    window.chat.confirm_delete(apples.id)
    assert [c.title for c in window.context.store.conversations()] == ["Bananas"]
    assert len(listing.items()) == 1


REPLY = """Here is a function that adds two numbers, with a quick check:

```python
def add(a: int, b: int) -> int:
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b


assert add(2, 40) == 42  # a line long enough to need the horizontal scroll bar of the code block, really
```

Why it works:

1. `+` on two `int`s is exact in Python (no overflow).
2. The type hints are **documentation**, not checks.

| input | output |
|---|---|
| `add(1, 2)` | 3 |
| `add(-1, 1)` | 0 |

Let me check the weather too.
<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
<parameter=unit>
celsius
</parameter>
</function>
</tool_call>"""


def test_markdown_code_blocks_and_tool_calls_render(app_env, qtbot):
    from PySide6.QtGui import QGuiApplication

    from app.chat.code_block import CodeBlock
    from app.chat.content_view import MarkdownLabel
    from app.chat.tool_call_view import ToolCallView

    window = open_window(qtbot, make_context(app_env), autoload=False)
    pieces = [(REPLY[i:i + 40], "") for i in range(0, len(REPLY), 40)]
    backend = ScriptedBackend([("", "The user wants an add function. "), ("", "Keep it short and typed.")] + pieces,
                              metrics={"ttft_ms": 180.0, "tok_s": 41.7, "prompt_tokens": 1204, "cached_tokens": 1024,
                                       "output_tokens": 212, "reasoning_tokens": 14})
    window.session.set_backend(backend)
    window.chat.set_model("Qwen3.6 27B FP8")
    window.show_page("chat")
    send(qtbot, window, "Write a Python function that adds two numbers, and what's the weather in Paris?")
    wait_reply(qtbot, window)
    view = window.chat.transcript.message_views()[-1]
    kinds = [type(w) for w in view.content.widgets()]
    assert kinds == [MarkdownLabel, CodeBlock, MarkdownLabel, ToolCallView]
    code = view.content.widgets()[1]
    assert code.language == "python" and code.code.startswith("def add(")
    code.copy_button.click()
    assert QGuiApplication.clipboard().text() == code.code and code.copy_button.text() == "Copied"
    (call,) = view.message.tool_calls
    assert call == {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    assert "<tool_call>" not in view.message.content
    assert "1.2K prompt (1K cached)" in view.metrics.text() and "41.7 tok/s" in view.metrics.text()
    assert view.thinking.isVisible() and not view.thinking.is_open
    window.chat.banner.clear()
    screenshot(window, "chat_markdown_code_tools")


XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
JSON_CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris", "hours": 24}}\n</tool_call>'


def drawn_calls(content_view) -> list[tuple[str, str]]:
    from app.chat.tool_call_view import ToolCallView

    return [(w.title.text(), w.arguments.text()) for w in content_view.widgets() if isinstance(w, ToolCallView)]


def test_xml_and_json_form_calls_show_their_name_and_arguments(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    reply = "Let me look both up.\n\n" + XML_CALL + "\n" + JSON_CALL
    window.session.set_backend(ScriptedBackend([(reply[i:i + 9], "") for i in range(0, len(reply), 9)]))
    window.chat.set_model("Qwen3.5 9B")
    window.show_page("chat")
    send(qtbot, window, "Weather and time in Paris?")
    wait_reply(qtbot, window)
    view = window.chat.transcript.message_views()[-1]
    assert view.message.content == "Let me look both up."
    assert view.message.tool_calls == [{"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}},
                                       {"name": "get_time", "arguments": {"zone": "Europe/Paris", "hours": 24}}]
    assert drawn_calls(view.content) == [("Tool call  ·  get_weather", "city: Paris\ndays: 3"),
                                         ("Tool call  ·  get_time", "zone: Europe/Paris\nhours: 24")]
    window.chat.banner.clear()
    screenshot(window, "chat_tool_calls_xml_and_json")


@pytest.mark.parametrize("cut, drawn", [
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
     ("Tool call  ·  get_weather  (writing…)", "city: Par")),
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Pa',
     ("Tool call  ·  get_time  (writing…)", "zone: Europe/Pa")),
    ("<tool_call>\n<function=get_wea", ("Tool call  ·  …  (writing…)", "…")),
])
def test_a_call_still_being_written_is_drawn_with_its_arguments_so_far(qapp, cut, drawn):
    from app.chat.content_view import ContentView, MarkdownLabel

    view = ContentView()
    view.set_text("Checking.\n" + cut, writing=True)
    assert type(view.widgets()[0]) is MarkdownLabel and view.widgets()[0].markdown == "Checking."
    assert drawn_calls(view) == [drawn]
    view.set_text("Checking.\n" + XML_CALL)              # the reply is complete
    assert drawn_calls(view) == [("Tool call  ·  get_weather", "city: Paris\ndays: 3")]


def test_streaming_calls_render(app_env, qtbot):
    from app.chat.content_view import ContentView

    view = ContentView()
    qtbot.addWidget(view)
    view.resize(640, 10)
    view.set_text("Let me check.\n" + XML_CALL + "\n" + JSON_CALL[:60], writing=True)
    view.show()
    qtbot.waitExposed(view)
    assert drawn_calls(view)[-1] == ("Tool call  ·  get_time  (writing…)", "zone: Euro")
    screenshot(view, "chat_tool_calls_streaming")


def test_the_engine_thread_carries_the_engines_parsed_calls(chat_window, qtbot):
    from engine.api import SamplingParams
    from tests.server_harness import Script

    engine = chat_window.engine
    tok = engine._engine.tokenizer
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    params = SamplingParams(max_tokens=80, temperature=0.0,
                            logits_processors=[Script(tok.encode("Checking.\n\n" + XML_CALL), tok.eos_token_ids[0])])
    deltas = []
    engine.delta.connect(lambda request_id, text, reasoning, tokens: deltas.append(text))
    with qtbot.waitSignal(engine.reply_finished, timeout=30_000) as finished:
        engine.generate("tools-1", [{"role": "user", "content": "Weather?"}], params,
                        {"tools": tools, "enable_thinking": False})
    request_id, result = finished.args
    assert request_id == "tools-1" and result.finish_reason == "tool_calls"
    assert result.tool_calls == [{"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}]
    assert "".join(deltas) + result.text == "Checking."


@pytest.fixture
def vision_window(app_env, qtbot, checkpoint, monkeypatch):
    """The app on a tiny checkpoint with a vision tower (the real engine takes its images)."""
    seeded_replies(monkeypatch)
    return loaded_window(app_env, qtbot, checkpoint("gqa3_ratio3"), max_tokens=12)


def test_a_dropped_image_reaches_the_engine_and_shows(vision_window, qtbot, tmp_path):
    window = vision_window
    assert window.engine.supports_vision
    engine = window.engine._engine
    composer = window.chat.composer
    assert composer.attach_button.isEnabled()
    image = QImage(320, 200, QImage.Format.Format_RGB32)
    image.fill(QColor("#5b8def"))
    path = tmp_path / "photo.png"
    image.save(str(path))
    drop = QMimeData()
    drop.setUrls([QUrl.fromLocalFile(str(path))])
    composer.input.insertFromMimeData(drop)
    composer.input.insertFromMimeData(drop)               # the same picture twice: stored once
    stored = set(composer.attachments.paths)
    assert len(composer.attachments.paths) == 2 and len(stored) == 1
    composer.input.insertFromMimeData(drop)
    composer.attachments.row.itemAt(2).widget().findChild(QToolButton).click()     # a third one, removed
    assert len(composer.attachments.paths) == 2
    kept = Path(stored.pop())                               # kept once per content, under the file's own name
    assert kept.parent.name == hashlib.sha256(path.read_bytes()).hexdigest() and kept.name == "photo.png"
    send(qtbot, window, "What colour is this?")
    wait_reply(qtbot, window)
    assert engine.stats()["images_encoded"] == 2           # the engine read both pictures
    (reply,) = assistant_messages(window)
    text_only = len(engine.encode_prompt([{"role": "user", "content": "What colour is this?"}],
                                         enable_thinking=False))
    assert reply.status != "error" and reply.content and reply.metrics["prompt_tokens"] > text_only + 2
    roles = [m.role for m in window.context.store.messages(window.session.current.id)]
    assert roles == ["user", "assistant"]                  # no "not sent" notice
    from app.chat.image_viewer import Thumbnail
    thumbs = window.chat.transcript.views[0].findChildren(Thumbnail)
    assert len(thumbs) == 2 and not thumbs[0].pixmap().isNull()
    screenshot(window, "chat_image_sent_to_vision_model")
    qtbot.mouseClick(thumbs[0], Qt.MouseButton.LeftButton)
    from app.chat.image_viewer import ImageViewer
    viewers = [w for w in QApplication.topLevelWidgets() if isinstance(w, ImageViewer) and w.isVisible()]
    assert viewers and viewers[0].image.pixmap().width() == 320
    viewers[0].close()
    window.session.regenerate(False)                      # a regenerate sends the same stored images again
    wait_reply(qtbot, window)
    (again,) = assistant_messages(window)
    assert again.status != "error" and again.metrics["prompt_tokens"] == reply.metrics["prompt_tokens"]


def test_a_file_that_is_not_an_image_is_refused_when_attached_by_its_name(vision_window, tmp_path):
    composer = vision_window.chat.composer
    fake = tmp_path / "holiday.png"
    fake.write_text("not a picture")
    drop = QMimeData()
    drop.setUrls([QUrl.fromLocalFile(str(fake))])
    composer.input.insertFromMimeData(drop)
    assert composer.attachments.paths == [] and composer.note.isVisible()
    assert composer.note.text().startswith("holiday.png cannot be attached: the image cannot be read")
    screenshot(vision_window, "chat_attachment_refused_by_name")


def test_an_image_that_cannot_be_read_is_marked_and_left_out_not_fatal(vision_window, qtbot, tmp_path):
    """A stored image that went bad (removed from disk, or attached by an older version that did not check it): its
    message is marked and the conversation goes on without it (it failed every later turn)."""
    window = vision_window
    image = QImage(64, 48, QImage.Format.Format_RGB32)
    image.fill(QColor("#4cc38a"))
    good, bad = tmp_path / "green.png", tmp_path / "scan.png"
    image.save(str(good))
    image.save(str(bad))
    drop = QMimeData()
    drop.setUrls([QUrl.fromLocalFile(str(good)), QUrl.fromLocalFile(str(bad))])
    window.chat.composer.input.insertFromMimeData(drop)
    good_kept, bad_kept = window.chat.composer.attachments.paths
    Path(bad_kept).write_bytes(b"\x89PNG\r\n\x1a\n broken")         # the stored copy goes bad before sending
    send(qtbot, window, "Two pictures?")
    wait_reply(qtbot, window)
    send(qtbot, window, "And now?")
    wait_reply(qtbot, window)
    replies = assistant_messages(window)
    assert len(replies) == 2 and all(r.status != "error" and r.content for r in replies)
    assert window.engine._engine.stats()["images_encoded"] >= 1
    window.session.open(window.session.current.id)
    from app.chat.image_viewer import Thumbnail
    thumbs = window.chat.transcript.views[0].findChildren(Thumbnail)
    marked = [t for t in thumbs if t.problem]
    assert len(thumbs) == 2 and len(marked) == 1 and marked[0].text().startswith("⚠ scan.png: ")
    assert "Left out of the conversation" in marked[0].text()
    screenshot(window, "chat_unreadable_image_marked")


def test_a_model_without_vision_refuses_images_before_sending(chat_window, qtbot, tmp_path):

    window = chat_window
    composer = window.chat.composer
    assert not composer.attach_button.isEnabled() and "does not take images" in composer.attach_button.toolTip()
    pasted = QMimeData()
    image = QImage(64, 64, QImage.Format.Format_RGB32)
    image.fill(QColor("#ef7a7a"))
    pasted.setImageData(image)
    composer.input.insertFromMimeData(pasted)
    assert composer.attachments.paths == [] and composer.note.isVisible()
    assert "does not take images" in composer.note.text()
    screenshot(window, "chat_image_refused_no_vision")


def test_each_reply_keeps_the_model_that_wrote_it(chat_window, qtbot, checkpoint):
    """Past replies were relabelled with the model loaded now; each records its own (and its weights)."""
    window = chat_window
    send(qtbot, window, "First model?")
    wait_reply(qtbot, window)
    first = window.engine.model.name
    other = checkpoint("gqa3_ratio3")
    window.load_model(str(other))
    wait_ready(qtbot, window)
    assert window.engine.model.name != first
    send(qtbot, window, "Second model?")
    wait_reply(qtbot, window)
    window.session.open(window.session.current.id)           # the transcript built again from the store
    views = [v for v in window.chat.transcript.message_views() if v.message.role == "assistant"]
    assert [v.speaker.text() for v in views] == [first, window.engine.model.name]
    assert views[0].message.metrics["model"] == {"name": first, "weights": "32-bit", "drafts": 0}   # fp32 on the CPU
    assert "32-bit weights" in views[0].speaker.toolTip()
    window.session.regenerate(False)                       # the new version is the second model's; the first stays
    wait_reply(qtbot, window)
    screenshot(window, "chat_replies_keep_their_model")


def test_loading_another_model_while_a_reply_streams_ends_the_reply(app_env, qtbot, checkpoint, monkeypatch):
    """The reply is stopped where it was and the chat is free again: the old engine's finish, sent after the session
    had let go of that backend, never arrived, and the chat stayed busy with a reply marked streaming."""
    seeded_replies(monkeypatch)
    window = loaded_window(app_env, qtbot, checkpoint("base"), max_tokens=3000)
    send(qtbot, window, "Go on.")
    qtbot.waitUntil(lambda: window.session.active is not None and window.session.active.tokens >= 3, timeout=30_000)
    window.load_model(str(checkpoint("gqa3_ratio3")))
    assert not window.session.busy                       # at once, whenever the old engine's finish comes
    wait_ready(qtbot, window)
    (reply,) = assistant_messages(window)
    assert reply.status == "stopped" and reply.content
    assert window.chat.transcript.message_views()[-1].message.status == "stopped" and not window.session.busy
    screenshot(window, "chat_model_changed_mid_reply")


def test_an_image_dropped_anywhere_on_the_chat_is_attached_and_the_box_lights_up_meanwhile(vision_window, qtbot,
                                                                                           tmp_path):
    """The empty chat says "drop them here", but only the message box took a drop, and nothing showed a drag."""
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QDragEnterEvent, QDropEvent

    window = vision_window
    image = QImage(40, 30, QImage.Format.Format_RGB32)
    image.fill(QColor("#e5b454"))
    path = tmp_path / "dropped.png"
    image.save(str(path))
    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(str(path))])
    target = window.chat.transcript                 # the middle of the page, far from the message box
    centre = QPointF(target.rect().center())
    actions = Qt.DropAction.CopyAction
    enter = QDragEnterEvent(centre.toPoint(), actions, data, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window.chat, enter)
    assert enter.isAccepted() and window.chat.composer.property("dropping") is True
    screenshot(window, "chat_drag_over_the_page")
    QApplication.sendEvent(window.chat, QDropEvent(centre, actions, data, Qt.MouseButton.LeftButton,
                                                   Qt.KeyboardModifier.NoModifier))
    assert [Path(p).name for p in window.chat.composer.attachments.paths] == ["dropped.png"]
    assert window.chat.composer.property("dropping") is False


def test_a_long_unbroken_word_wraps_instead_of_being_clipped(app_env, qtbot):
    from app.chat.content_view import MarkdownLabel
    from app.chat.long_text import LongText
    from app.formatting import breakable

    word = "https://example.com/" + "a" * 150 + "/index.html"
    assert breakable(word).replace("\u200b", "") == word and "\u200b" in breakable(word)
    for widget, shown in ((LongText(word), lambda w: w.text), (MarkdownLabel(f"See {word} here"), lambda w: w)):
        label = shown(widget)
        assert label.minimumSizeHint().width() < 300     # the whole word was its minimum width: the bubble clipped it
        widget.setFixedWidth(300)
        qtbot.addWidget(widget)
        widget.show()
        assert label.heightForWidth(300) // label.fontMetrics().lineSpacing() >= 3
    screenshot(widget, "chat_long_word_wraps")

"""A conversation that outgrows the context (truncate or stop and ask), the draft's token count, the
gauge while a reply streams, folded long pastes, and Continue after a reply hit its token limit; through
the real engine thread and a tiny checkpoint with a small context."""

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.chat.context_fit import fit_history, prompt_budget
from tests.app_support import make_context, open_window, screenshot, seeded_replies, send, wait_ready, wait_reply

CONTEXT = 256


@pytest.fixture
def small_context(app_env, qtbot, checkpoint, monkeypatch):
    seeded_replies(monkeypatch)
    path = checkpoint("base")
    context = make_context(app_env, last_model=str(path), max_tokens=16, thinking=False, max_context=CONTEXT,
                           model_folders=[str(Path(path).parent)])
    window = open_window(qtbot, context)
    wait_ready(qtbot, window)
    assert window.engine.max_context == CONTEXT
    return window


def messages_of(window):
    return window.context.store.messages(window.session.current.id)


def test_fit_history_leaves_out_whole_oldest_turns():
    history = [{"role": "system", "content": "s"}] + [
        {"role": role, "content": f"{role}{i}"} for i in range(5) for role in ("user", "assistant")]
    count = lambda h: 10 * len(h)          # noqa: E731
    assert fit_history(history, count, 200).left_out == 0
    fit = fit_history(history, count, 55)
    assert fit.history[0]["role"] == "system" and fit.history[1] == {"role": "user", "content": "user3"}
    assert fit.left_out == 6 and fit.tokens == 50
    assert fit_history(history, count, 25) is None            # the latest turn alone is 30
    assert prompt_budget(256, 16) == 240 and prompt_budget(256, 4096) == 192


def test_a_long_conversation_leaves_out_its_oldest_turns_and_goes_on(small_context, qtbot):
    window = small_context
    contexts = []
    window.session.context_changed.connect(lambda used, total, left: contexts.append((window.session.busy, used, left)))
    for i in range(6):
        send(qtbot, window, f"Question {i}: " + "tell me more about that " * 6)
        wait_reply(qtbot, window)
    replies = [m for m in messages_of(window) if m.role == "assistant"]
    assert [r.status for r in replies] == ["complete"] * 6 and all(r.content for r in replies)
    assert all(r.metrics["prompt_tokens"] <= prompt_budget(CONTEXT, 16) for r in replies)
    assert window.session.left_out > 0 and window.chat.gauge.left_out == window.session.left_out
    assert "oldest left out" in window.chat.gauge.left_out_text.text()
    assert any(busy and used > 0 for busy, used, _ in contexts), "the gauge moved while a reply streamed"
    screenshot(window, "chat_context_truncated")


def test_stop_policy_asks_and_leaving_out_answers(small_context, qtbot):
    window = small_context
    window.context.save_settings(window.context.settings.copy(context_policy="stop"))
    for i in range(6):
        send(qtbot, window, f"Question {i}: " + "tell me more about that " * 6)
        wait_reply(qtbot, window)
        if messages_of(window)[-1].role == "notice":
            break
    notice = messages_of(window)[-1]
    assert notice.role == "notice" and "no longer fits" in notice.content
    assert messages_of(window)[-2].role == "user", "nothing was sent"
    view = window.chat.transcript.views[-1]
    assert set(view.buttons) == {"new_chat", "leave_out"}
    screenshot(window, "chat_context_full")
    view.buttons["leave_out"].click()
    wait_reply(qtbot, window)
    assert messages_of(window)[-1].role == "assistant" and messages_of(window)[-1].status == "complete"
    assert window.session.current.options["context_policy"] == "truncate" and window.session.left_out > 0
    last_user = [m for m in messages_of(window) if m.role == "user"][-1].content
    window.chat.transcript.views[-2].buttons["new_chat"].click()
    assert window.session.current is None and window.chat.composer.input.toPlainText() == last_user


def test_draft_token_count_under_the_composer(small_context, qtbot):
    window = small_context
    composer = window.chat.composer
    qtbot.keyClicks(composer.input, "How many tokens is this?")
    qtbot.waitUntil(lambda: composer.draft_count.text().endswith("tokens"), timeout=3000)
    draft = int(composer.draft_count.text().split()[0])
    assert 0 < draft < 40 and not composer.draft_count.property("over")
    composer.input.setPlainText("word " * 400)
    qtbot.waitUntil(lambda: "shorten it" in composer.draft_count.text(), timeout=3000)
    assert composer.draft_count.property("over")
    screenshot(window.chat, "chat_draft_count_over")
    send(qtbot, window, "Question: " + "tell me more about that " * 6)
    wait_reply(qtbot, window)
    composer.input.setPlainText("And then? " + "tell me more about that " * 6)
    qtbot.waitUntil(lambda: "left out to fit" in composer.draft_count.text(), timeout=3000)
    screenshot(window.chat, "chat_draft_count_leaves_out")
    composer.input.clear()
    qtbot.waitUntil(lambda: composer.draft_count.text() == "", timeout=3000)


def test_continue_after_a_length_stop_extends_the_same_message(small_context, qtbot):
    window = small_context
    send(qtbot, window, "Write a long story")
    wait_reply(qtbot, window)
    (reply,) = [m for m in messages_of(window) if m.role == "assistant"]
    assert reply.metrics["finish"] == "length"
    view = window.chat.transcript.message_views()[-1]
    assert view.continue_button.isVisible()
    rates = []
    window.session.reply_updated.connect(lambda *_: rates.append(view.metrics.text()))
    qtbot.mouseClick(view.continue_button, Qt.MouseButton.LeftButton)
    wait_reply(qtbot, window)
    (continued,) = [m for m in messages_of(window) if m.role == "assistant"]
    assert continued.id == reply.id and continued.content.startswith(reply.content)
    assert len(continued.content) > len(reply.content)
    assert continued.metrics["output_tokens"] == 2 * reply.metrics["output_tokens"]
    assert continued.metrics["prompt_tokens"] == reply.metrics["prompt_tokens"]
    assert any("tokens" in r for r in rates), "live numbers while it streamed"
    assert window.chat.transcript.message_views()[-1] is view and view.continue_button.isVisible()
    screenshot(window, "chat_continue")


def test_a_long_paste_is_folded_and_opens(app_env, qtbot):
    from tests.app_support import ScriptedBackend

    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.session.set_backend(ScriptedBackend([("Thanks, I read it all.", "")]))
    window.chat.set_model("Scripted")
    window.show_page("chat")
    pasted = "\n".join(f"{i:03d} log line with some text in it" for i in range(60))
    send(qtbot, window, "Here is the log:\n" + pasted)
    wait_reply(qtbot, window)
    text = window.chat.transcript.message_views()[0].text
    assert text.head is not None and text.text.text() == text.head and "059" not in text.head
    assert text.toggle.isVisible() and "61 lines" in text.toggle.text()
    window.chat.banner.clear()
    screenshot(window, "chat_long_paste_folded")
    text.toggle.click()
    assert text.expanded and text.text.text().endswith("059 log line with some text in it")
    assert text.toggle.text() == "Show less"

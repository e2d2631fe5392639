"""Conversations: titles cut with an ellipsis, the list grouped by when each was last active, one
message deleted on its own."""

import datetime as dt

from app.chat.conversation_list import age_group
from app.chat.session import title_from
from tests.app_support import ScriptedBackend, make_context, open_window, screenshot, send, wait_reply


def test_titles_cut_at_a_word_with_an_ellipsis():
    assert title_from("Short question\nsecond line") == "Short question"
    long = "Explain how the gated delta rule keeps a recurrent state per head in linear attention"
    assert title_from(long) == "Explain how the gated delta rule keeps a…"
    assert title_from("") == "Images" and title_from("x" * 60) == "x" * 48 + "…"


def test_age_groups():
    today = dt.date(2025, 6, 15)
    at = lambda *d: dt.datetime(*d, 12).timestamp()       # noqa: E731
    assert [age_group(at(2025, 6, 15), today), age_group(at(2025, 6, 14), today), age_group(at(2025, 6, 10), today),
            age_group(at(2025, 3, 2), today), age_group(at(2024, 12, 1), today)] == \
        ["Today", "Yesterday", "Previous 7 days", "March", "December 2024"]


def test_list_grouped_by_date_and_one_message_deleted(app_env, qtbot, monkeypatch):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.session.set_backend(ScriptedBackend([("An answer.", "")]))
    window.chat.set_model("Scripted")
    window.show_page("chat")
    store = window.context.store
    for title, days in (("Trip to Lisbon", 40), ("Budget for the garden shed project and what it costs", 3),
                        ("Yesterday's bug", 1)):
        conversation = store.create_conversation(title)
        store.db.execute("UPDATE conversations SET updated=? WHERE id=?",
                         ((dt.datetime.now() - dt.timedelta(days=days)).timestamp(), conversation.id))
    send(qtbot, window, "What is the capital of Portugal, and what is the best time of the year to visit it?")
    wait_reply(qtbot, window)
    listing = window.chat.conversations
    headings = [listing.list.item(i).text() for i in range(listing.list.count())
                if listing.list.item(i) not in listing.items()]
    assert headings[:3] == ["Today", "Yesterday", "Previous 7 days"] and len(headings) == 4
    assert listing.items()[0].text().endswith("…")
    window.chat.banner.clear()
    screenshot(window, "chat_conversations_by_date")
    monkeypatch.setattr("app.dialogs.confirm", lambda *args: True)
    user_view, reply_view = window.chat.transcript.message_views()
    qtbot.mouseClick(reply_view.delete_button, __import__("PySide6.QtCore").QtCore.Qt.MouseButton.LeftButton)
    assert [m.role for m in store.messages(window.session.current.id)] == ["user"]
    assert [v.message.role for v in window.chat.transcript.message_views()] == ["user"]


def test_a_pinned_conversation_lists_first(app_env, qtbot):
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.show_page("chat")
    store = window.context.store
    old = store.create_conversation("Recipe notes")
    store.db.execute("UPDATE conversations SET updated=? WHERE id=?",
                     ((dt.datetime.now() - dt.timedelta(days=30)).timestamp(), old.id))
    store.create_conversation("Fresh question")
    window.chat.refresh_conversations()
    listing = window.chat.conversations
    assert [i.text() for i in listing.items()] == ["Fresh question", "Recipe notes"]
    listing.pin_requested.emit(old.id, True)                  # what the row's menu "Pin to the top" sends
    rows = [listing.list.item(i).text() for i in range(listing.list.count())]
    assert rows[:4] == ["Pinned", "Recipe notes", "Today", "Fresh question"]
    assert store.conversation(old.id).pinned
    window.chat.banner.clear()
    screenshot(window, "chat_conversation_pinned")
    listing.pin_requested.emit(old.id, False)
    assert [i.text() for i in listing.items()] == ["Fresh question", "Recipe notes"]


def test_the_list_folds_away_on_a_narrow_window(app_env, qtbot):
    from PySide6.QtCore import Qt

    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.show_page("chat")
    store = window.context.store
    first = store.create_conversation("A conversation with a rather long title to elide")
    store.create_conversation("Another one")
    window.resize(1280, 800)
    qtbot.waitUntil(lambda: window.chat.conversations.isVisible())
    window.resize(800, 560)
    qtbot.waitUntil(lambda: not window.chat.conversations.isVisible())
    assert window.size().width() == 800 and window.size().height() == 560
    window.chat.banner.clear()
    screenshot(window, "chat_800x560_list_folded")
    qtbot.mouseClick(window.chat.sidebar_button, Qt.MouseButton.LeftButton)
    assert window.chat.conversations.isVisible()
    window.chat.refresh_conversations()
    screenshot(window, "chat_800x560_list_open")
    item = window.chat.conversations.items()[-1]
    window.chat.conversations._on_clicked(item)               # picking one folds the list again
    assert window.session.current.id == first.id and not window.chat.conversations.isVisible()
    qtbot.keyClick(window.chat, Qt.Key.Key_B, Qt.KeyboardModifier.ControlModifier)
    assert window.chat.conversations.isVisible()
    window.resize(1280, 800)                                  # wide again: the list as the user left it
    qtbot.waitUntil(lambda: window.chat.conversations.isVisible())
    qtbot.mouseClick(window.chat.sidebar_button, Qt.MouseButton.LeftButton)
    assert not window.chat.conversations.isVisible()


def test_up_in_an_empty_composer_edits_the_last_message(app_env, qtbot):
    from PySide6.QtCore import Qt

    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.session.set_backend(ScriptedBackend([("An answer.", "")]))
    window.chat.set_model("Scripted")
    window.show_page("chat")
    send(qtbot, window, "First try")
    wait_reply(qtbot, window)
    composer = window.chat.composer
    composer.input.setPlainText("draft")
    qtbot.keyClick(composer.input, Qt.Key.Key_Up)              # a draft: Up only moves the cursor
    assert not composer.editing and composer.input.toPlainText() == "draft"
    composer.input.clear()
    qtbot.keyClick(composer.input, Qt.Key.Key_Up)
    assert composer.editing and composer.input.toPlainText() == "First try"
    window.chat.banner.clear()
    screenshot(window, "chat_up_edits_last")
    composer.input.setPlainText("Second try")
    qtbot.keyClick(composer.input, Qt.Key.Key_Return)
    wait_reply(qtbot, window)
    assert [(m.role, m.content) for m in window.context.store.messages(window.session.current.id)] == [
        ("user", "Second try"), ("assistant", "An answer.")]


def test_an_edit_keeps_the_earlier_versions_and_the_title_follows(app_env, qtbot):
    """Issue 47, item 15: an edit threw away the reply's regenerated versions, and the title kept the old text."""
    window = open_window(qtbot, make_context(app_env), autoload=False)
    window.session.set_backend(ScriptedBackend([("An answer.", "")]))
    window.chat.set_model("Scripted")
    window.show_page("chat")
    send(qtbot, window, "First try")
    wait_reply(qtbot, window)
    window.session.regenerate(False)
    wait_reply(qtbot, window)
    assert window.session.begin_edit().content == "First try"
    send(qtbot, window, "Second try")
    wait_reply(qtbot, window)
    store, conversation = window.context.store, window.session.current
    user, reply = store.messages(conversation.id)
    assert (user.content, reply.version_count, reply.version) == ("Second try", 3, 2)
    assert [v["metrics"]["prompt"]["content"] for v in reply.all_versions()] == ["First try", "First try",
                                                                                 "Second try"]
    assert store.conversation(conversation.id).title == "Second try"
    view = window.chat.transcript.view_for(reply.id)
    assert view.versions.isVisible()
    screenshot(window, "chat_edit_keeps_versions")
    window.session.show_version(reply.id, 0)              # back to an answer to the first text: its question too
    user, reply = store.messages(conversation.id)
    assert (user.content, reply.version) == ("First try", 0)
    assert window.chat.transcript.message_views()[0].message.content == "First try"
    assert store.conversation(conversation.id).title == "First try"

"""The store: a database made before versions and pins opens with them added, and a reply's versions
switch without losing any."""

import sqlite3

from app.store import Store


def test_old_database_gains_the_new_columns(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, created REAL NOT NULL,
                                    updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL DEFAULT '', reasoning TEXT NOT NULL DEFAULT '', tool_calls TEXT NOT NULL DEFAULT '[]',
            attachments TEXT NOT NULL DEFAULT '[]', metrics TEXT NOT NULL DEFAULT '{}',
            status TEXT NOT NULL DEFAULT 'complete', error TEXT NOT NULL DEFAULT '', created REAL NOT NULL);
        INSERT INTO conversations(title, created, updated) VALUES ('Old one', 1, 1);
        INSERT INTO messages(conversation_id, role, content, created) VALUES (1, 'assistant', 'old reply', 1);
    """)
    db.commit()
    db.close()
    store = Store(path)
    (conversation,) = store.conversations()
    assert conversation.options == {} and conversation.pinned is False
    (message,) = store.messages(conversation.id)
    assert message.content == "old reply" and message.versions == [] and message.version_count == 1
    store.close()


def test_versions_switch_and_pins_list_first(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    first, second = store.create_conversation("first"), store.create_conversation("second")
    reply = store.add_message(first.id, "assistant", content="one", metrics={"output_tokens": 3})
    fresh = store.new_version(reply.id)
    assert (fresh.content, fresh.status, fresh.version, fresh.version_count) == ("", "streaming", 1, 2)
    store.update_message(reply.id, content="two", status="complete")
    shown = store.show_version(reply.id, 0)
    assert (shown.content, shown.metrics, shown.version) == ("one", {"output_tokens": 3}, 0)
    assert [v["content"] for v in shown.all_versions()] == ["one", "two"]
    assert store.show_version(reply.id, 1).content == "two"
    store.update_message(reply.id, status="error", content="")      # an empty failure is not kept as a version
    assert [v["content"] for v in store.new_version(reply.id).all_versions()] == ["one", ""]
    store.touch_conversation(second.id)
    assert [c.title for c in store.conversations()] == ["second", "first"]
    store.set_pinned(first.id, True)
    assert [(c.title, c.pinned) for c in store.conversations()] == [("first", True), ("second", False)]
    store.close()

"""Persistence: conversations, messages and settings in one sqlite file.

WAL journal and a commit after every write, so a crash loses at most the message being
streamed (and that one is saved every few seconds while it streams). Only the GUI thread uses
the store.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- ids are never reused (request ids derive from them)
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    options TEXT NOT NULL DEFAULT '{}',     -- this conversation's own settings (context policy, ...)
    pinned INTEGER NOT NULL DEFAULT 0       -- listed first
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- ids are never reused (request ids derive from them)
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL DEFAULT '',
    reasoning TEXT NOT NULL DEFAULT '',
    tool_calls TEXT NOT NULL DEFAULT '[]',
    attachments TEXT NOT NULL DEFAULT '[]',
    metrics TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL DEFAULT 'complete',
    error TEXT NOT NULL DEFAULT '',
    versions TEXT NOT NULL DEFAULT '[]',    -- a regenerated reply's other versions (VERSION_FIELDS each)
    version INTEGER NOT NULL DEFAULT 0,     -- the place of the row's own version among them
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS downloads (repo_id TEXT PRIMARY KEY, record TEXT NOT NULL);
"""

JSON_FIELDS = ("tool_calls", "attachments", "metrics", "versions")
MESSAGE_FIELDS = ("content", "reasoning", "tool_calls", "attachments", "metrics", "status", "error", "versions",
                  "version")
VERSION_FIELDS = ("content", "reasoning", "tool_calls", "metrics", "status", "error")   # what a version holds
# columns added since a database was made: table -> (column, its definition)
ADDED_COLUMNS = {
    "conversations": (("options", "TEXT NOT NULL DEFAULT '{}'"), ("pinned", "INTEGER NOT NULL DEFAULT 0")),
    "messages": (("versions", "TEXT NOT NULL DEFAULT '[]'"), ("version", "INTEGER NOT NULL DEFAULT 0")),
}


@dataclass
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    options: dict = field(default_factory=dict)   # this conversation's own settings: context_policy,
    #                                               system_prompt, sampling (AppSettings fields it overrides)
    pinned: bool = False


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str                       # user | assistant
    content: str = ""
    reasoning: str = ""
    tool_calls: list = field(default_factory=list)
    attachments: list = field(default_factory=list)   # image file paths
    metrics: dict = field(default_factory=dict)       # usage + timings of an assistant reply
    status: str = "complete"        # complete | streaming | stopped | error
    error: str = ""
    versions: list = field(default_factory=list)      # a regenerated reply's other versions, in order
    version: int = 0                                  # where this version sits among them
    created: float = 0.0

    @property
    def version_count(self) -> int:
        return len(self.versions) + 1

    def all_versions(self) -> list[dict]:
        """Every version of the reply in order, the row's own at `version`."""
        own = {k: getattr(self, k) for k in VERSION_FIELDS}
        return self.versions[:self.version] + [own] + self.versions[self.version:]


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path))
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)
        self._migrate()
        self._recover_interrupted()

    def close(self) -> None:
        self.db.close()

    def _migrate(self) -> None:
        """Columns added since a database was made."""
        for table, added in ADDED_COLUMNS.items():
            columns = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}
            for name, definition in added:
                if name not in columns:
                    with self.db:
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")

    def _recover_interrupted(self) -> None:
        """A reply that was streaming when the app died ends as 'stopped' with what was saved."""
        with self.db:
            self.db.execute("UPDATE messages SET status='stopped' WHERE status='streaming'")

    # ---- conversations ---------------------------------------------------------------------
    def create_conversation(self, title: str) -> Conversation:
        now = time.time()
        with self.db:
            cur = self.db.execute("INSERT INTO conversations(title, created, updated) VALUES (?, ?, ?)",
                                  (title, now, now))
        return Conversation(_row_id(cur), title, now, now)

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute("SELECT * FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        return _conversation(row) if row else None

    def conversations(self, search: str = "") -> list[Conversation]:
        """Pinned ones first, then newest first; `search` matches titles and message text."""
        if search:
            like = f"%{search}%"
            rows = self.db.execute(
                "SELECT * FROM conversations WHERE title LIKE ? OR id IN "
                "(SELECT conversation_id FROM messages WHERE content LIKE ?) ORDER BY pinned DESC, updated DESC",
                (like, like)).fetchall()
        else:
            rows = self.db.execute("SELECT * FROM conversations ORDER BY pinned DESC, updated DESC").fetchall()
        return [_conversation(r) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def set_conversation_options(self, conversation_id: int, options: dict) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET options=? WHERE id=?", (json.dumps(options), conversation_id))

    def set_pinned(self, conversation_id: int, pinned: bool) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET pinned=? WHERE id=?", (int(pinned), conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def touch_conversation(self, conversation_id: int) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (time.time(), conversation_id))

    # ---- messages --------------------------------------------------------------------------
    def add_message(self, conversation_id: int, role: str, **fields) -> Message:
        message = Message(id=0, conversation_id=conversation_id, role=role, created=time.time(), **fields)
        values = [_encode(k, getattr(message, k)) for k in MESSAGE_FIELDS]
        with self.db:
            cur = self.db.execute(
                f"INSERT INTO messages(conversation_id, role, {', '.join(MESSAGE_FIELDS)}, created) "
                f"VALUES (?, ?, {', '.join('?' * len(MESSAGE_FIELDS))}, ?)",
                (conversation_id, role, *values, message.created))
            self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (message.created, conversation_id))
        message.id = _row_id(cur)
        return message

    def update_message(self, message_id: int, **fields) -> None:
        unknown = set(fields) - set(MESSAGE_FIELDS)
        if unknown:
            raise ValueError(f"unknown message fields: {sorted(unknown)}")
        assignments = ", ".join(f"{k}=?" for k in fields)
        with self.db:
            self.db.execute(f"UPDATE messages SET {assignments} WHERE id=?",
                            (*[_encode(k, v) for k, v in fields.items()], message_id))

    def message(self, message_id: int) -> Message | None:
        row = self.db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        return _message(row) if row else None

    def _stored(self, message_id: int) -> Message:
        message = self.message(message_id)
        if message is None:
            raise ValueError(f"no message {message_id}")
        return message

    def new_version(self, message_id: int) -> Message:
        """A reply about to be regenerated: its version joins the others (unless it holds nothing, as a
        failure before the first token) and the row starts empty, shown last."""
        message = self._stored(message_id)
        versions = [v for v in message.all_versions() if v["content"] or v["reasoning"] or v["tool_calls"]]
        self.update_message(message_id, content="", reasoning="", tool_calls=[], metrics={}, status="streaming",
                            error="", versions=versions, version=len(versions))
        return self._stored(message_id)

    def show_version(self, message_id: int, index: int) -> Message:
        """The reply's version `index` becomes the row's own (the one the conversation goes on from)."""
        versions = self._stored(message_id).all_versions()
        if not 0 <= index < len(versions):
            raise ValueError(f"no version {index} of message {message_id}")
        shown = versions.pop(index)
        self.update_message(message_id, **shown, versions=versions, version=index)
        return self._stored(message_id)

    def delete_message(self, message_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM messages WHERE id=?", (message_id,))

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY id",
                               (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    # ---- settings and downloads ------------------------------------------------------------
    def get_setting(self, key: str, default=None):
        row = self.db.execute("SELECT value FROM settings WHERE key=?", (key,)).fetchone()
        return json.loads(row["value"]) if row else default

    def set_setting(self, key: str, value) -> None:
        with self.db:
            self.db.execute("INSERT INTO settings(key, value) VALUES (?, ?) "
                            "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, json.dumps(value)))

    def save_download(self, repo_id: str, record: dict) -> None:
        with self.db:
            self.db.execute("INSERT INTO downloads(repo_id, record) VALUES (?, ?) "
                            "ON CONFLICT(repo_id) DO UPDATE SET record=excluded.record", (repo_id, json.dumps(record)))

    def delete_download(self, repo_id: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM downloads WHERE repo_id=?", (repo_id,))

    def downloads(self) -> dict[str, dict]:
        return {r["repo_id"]: json.loads(r["record"]) for r in self.db.execute("SELECT * FROM downloads")}


def _encode(key: str, value):
    return json.dumps(value) if key in JSON_FIELDS else value


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made (sqlite gives every row one)."""
    if cursor.lastrowid is None:
        raise sqlite3.DatabaseError("the insert made no row")
    return cursor.lastrowid


def _conversation(row: sqlite3.Row) -> Conversation:
    data = dict(row)
    data["options"] = json.loads(data["options"])
    data["pinned"] = bool(data["pinned"])
    return Conversation(**data)


def _message(row: sqlite3.Row) -> Message:
    data = dict(row)
    for key in JSON_FIELDS:
        data[key] = json.loads(data[key])
    return Message(**data)

"""A conversation to a file and back: Markdown to read or share, JSON that imports losslessly (images
travel inside it, base64-encoded, and land in the attachments folder again)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from pathlib import Path

from app.chat.attachments import IMAGE_SUFFIXES
from app.store import VERSION_FIELDS, Conversation, Message, Store

FORMAT = "qwendesk.conversation"
VERSION = 1
ROLES = ("user", "assistant", "notice", "tool")
KEPT_FIELDS = ("role", "content", "reasoning", "tool_calls", "metrics", "status", "error", "versions", "version")
TYPES = {"role": str, "content": str, "reasoning": str, "tool_calls": list, "metrics": dict, "status": str,
         "error": str, "versions": list, "version": int}


def safe_file_name(title: str) -> str:
    """A conversation's title as a file name on any system."""
    return re.sub(r'[\\/:*?"<>|\x00-\x1f]+', " ", title).strip(" .")[:80] or "conversation"


def to_markdown(conversation: Conversation, messages: list[Message], model_name: str = "Assistant") -> str:
    """The conversation as Markdown: a heading per turn, reasoning quoted, images linked by path."""
    when = dt.datetime.fromtimestamp(conversation.created).strftime("%d %B %Y, %H:%M")
    parts = [f"# {conversation.title}", f"*{when}*"]
    if conversation.options.get("system_prompt"):
        parts.append("## System\n\n" + conversation.options["system_prompt"].strip())
    for m in messages:
        if m.role == "notice":
            parts.append(f"> *{m.content}*")
            continue
        if m.role == "tool":
            parts.append(_tool_result(m))
            continue
        body = []
        if m.reasoning.strip():
            body.append("\n".join("> " + line for line in ["**Thinking**", ""] + m.reasoning.strip().splitlines()))
        body += [f"![image]({Path(p).as_uri()})" for p in m.attachments]
        if m.content.strip():
            body.append(m.content.strip())
        body += [f"**Tool call** `{c.get('name', '')}`\n\n```json\n{_arguments(c)}\n```" for c in m.tool_calls]
        if m.error:
            body.append(f"*Error: {m.error}*")
        writer = 'You' if m.role == 'user' else (m.metrics.get("model") or {}).get("name") or model_name
        parts.append(f"## {writer}\n\n" + "\n\n".join(body))
    return "\n\n".join(parts) + "\n"


def to_json(conversation: Conversation, messages: list[Message]) -> dict:
    """Everything the store holds of the conversation, images included."""
    return {"format": FORMAT, "version": VERSION, "title": conversation.title, "created": conversation.created,
            "options": conversation.options,
            "messages": [{**{k: getattr(m, k) for k in KEPT_FIELDS}, "created": m.created,
                          "images": [_image(p) for p in m.attachments]} for m in messages]}


def import_json(store: Store, data, keep_bytes) -> Conversation:
    """A conversation written by to_json, as a new one in the store; `keep_bytes(data, suffix) -> path`
    stores an image. A file that is not one raises ValueError saying why, and nothing is stored."""
    messages = _checked(data)
    conversation = store.create_conversation(data["title"].strip() or "Imported chat")
    store.set_conversation_options(conversation.id, data.get("options") or {})
    conversation.options = data.get("options") or {}
    for m in messages:
        paths = [keep_bytes(base64.b64decode(image["data"]), image["suffix"]) for image in m.pop("images")]
        status = "stopped" if m["status"] == "streaming" else m["status"]
        store.add_message(conversation.id, m.pop("role"), **{**m, "status": status, "attachments": paths})
    return conversation


def _tool_result(m: Message) -> str:
    """A tool message: which tool ran where and what came back (a denied or failed call says so)."""
    metrics = m.metrics
    where = f" on {metrics['server']}" if metrics.get("server") else ""
    status = metrics.get("status", "ok")
    head = f"**Tool result** `{metrics.get('tool', '')}`{where}" + ("" if status == "ok" else f" ({status})")
    images = [f"![image]({Path(p).as_uri()})" for p in m.attachments]
    return "\n\n".join([head, f"```\n{m.content.strip()}\n```", *images])


def _arguments(call: dict) -> str:
    arguments = call.get("arguments", "")
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, indent=1)


def _image(path: str) -> dict:
    return {"suffix": Path(path).suffix.lower(), "data": base64.b64encode(Path(path).read_bytes()).decode()}


def _checked(data) -> list[dict]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("This file is not a conversation exported by Qwen Desk.")
    if data.get("version") != VERSION:
        raise ValueError(f"This conversation was exported in format version {data.get('version')}; "
                         f"this app reads version {VERSION}.")
    if not isinstance(data.get("title"), str) or not isinstance(data.get("options", {}), dict):
        raise ValueError("The file's title or options are malformed.")
    if not isinstance(data.get("messages"), list):
        raise ValueError("The file has no list of messages.")
    messages = []
    for i, m in enumerate(data["messages"], 1):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"Message {i} has no known role.")
        kept = {k: m[k] for k in KEPT_FIELDS if k in m}
        wrong = [k for k, v in kept.items() if not isinstance(v, TYPES[k])]
        images = m.get("images", [])
        if not wrong and not all(_is_version(v) for v in kept.get("versions", [])):
            wrong = ["versions"]
        if not wrong and not 0 <= kept.get("version", 0) <= len(kept.get("versions", [])):
            wrong = ["version"]
        if wrong or not isinstance(images, list) or not all(_is_image(x) for x in images):
            raise ValueError(f"Message {i} is malformed ({', '.join(wrong) or 'images'}).")
        kept.setdefault("status", "complete")
        messages.append({**kept, "images": images})
    return messages


def _is_version(entry) -> bool:
    return (isinstance(entry, dict) and set(entry) <= set(VERSION_FIELDS)
            and all(isinstance(v, TYPES[k]) for k, v in entry.items()))


def _is_image(entry) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("data"), str):
        return False
    suffix = entry.get("suffix")
    if not isinstance(suffix, str) or suffix not in IMAGE_SUFFIXES:
        return False
    try:
        base64.b64decode(entry["data"], validate=True)
    except ValueError:
        return False
    return True

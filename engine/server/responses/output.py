"""ResponseBuilder: a generation's events -> the Response's output items, and the streaming events.

Both the streamed and the plain response go through it, so they hold the same items. Each change of
piece kind closes the open item and opens the next: reasoning -> a `reasoning` item (its text as a
`reasoning_text` content part; as a `summary_text` part instead when the request asked for a
summary, since the model writes no separate summary), text -> a `message` item with one
`output_text` part, each tool call -> a `function_call` item. Events follow the API's order:
output_item.added, content_part.added (or reasoning_summary_part.added), deltas, the text's done,
content_part.done, output_item.done; every event carries its sequence_number.
"""

from __future__ import annotations

import copy
import secrets
import time

from engine.api import CallArgs, CallStart, Reasoning, Text, Usage
from engine.server.bridge.generation import Finish, Logprobs
from engine.server.openai.logprobs import chat_logprobs
from engine.server.responses.convert import seal


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class ResponseBuilder:
    def __init__(self, response: dict, *, summary: bool = False, sealed: bool = False, token_bytes=None):
        """`response`: the Response object (status in_progress, empty output), filled in place.
        `sealed`: reasoning items also carry their text as encrypted_content. `token_bytes`: set when
        the request asked for the output text's logprobs."""
        self.response, self.summary, self.sealed, self.token_bytes = response, summary, sealed, token_bytes
        self.seq = 0
        self.item: dict | None = None       # the open output item
        self.text: list[str] = []           # its text (or arguments) so far
        self.logprobs: list[dict] = []      # the open message's logprobs
        self.pending: list = []             # logprobs waiting for the text they belong to

    @property
    def index(self) -> int:
        return len(self.response["output"]) - 1

    def event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict]:
        return [self.event(kind, response=copy.deepcopy(self.response))
                for kind in ("response.created", "response.in_progress")]

    def feed(self, ev) -> list[dict]:
        kind = self.item and self.item["type"]
        if isinstance(ev, Logprobs):
            self.pending += ev.items
            return []
        if isinstance(ev, Reasoning) and ev.text and kind != "function_call":  # (thinking inside a call: dropped)
            return (self.close() + self.open_reasoning() if kind != "reasoning" else []) + self.delta(ev.text)
        if isinstance(ev, Text) and ev.text:
            return (self.close() + self.open_message() if kind != "message" else []) + self.delta(ev.text)
        if isinstance(ev, (CallStart, CallArgs)):
            self.pending = []                   # a call's tokens have no place for logprobs
        if isinstance(ev, CallStart):
            return self.close() + self.open_call(ev.name)
        if isinstance(ev, CallArgs) and kind == "function_call":
            return self.delta(ev.text)
        return []

    def finish(self, finish: Finish) -> list[dict]:
        r, err = self.response, finish.api_error()
        if err is not None:
            r["status"], r["error"] = "failed", {"code": "server_error", "message": err.message}
        elif finish.reason == "length":
            r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        else:
            r["status"], r["completed_at"] = "completed", int(time.time())
        out = self.close("completed" if r["status"] == "completed" else "incomplete")
        r["usage"] = usage_json(finish.usage)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(r["status"],
                                                                                              "response.failed")
        return out + [self.event(kind, response=copy.deepcopy(r))]

    # ---- items -----------------------------------------------------------------------------------
    def _open(self, item: dict) -> dict:
        self.item, self.text, self.logprobs = item, [], []
        self.response["output"].append(item)
        return self.event("response.output_item.added", output_index=self.index, item=copy.deepcopy(item))

    def _open_item(self) -> dict:
        assert self.item is not None, "no output item is open"
        return self.item

    def _at(self) -> dict:
        return {"item_id": self._open_item()["id"], "output_index": self.index}

    def open_reasoning(self) -> list[dict]:
        item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"}
        if self.summary:
            return [self._open(item), self.event("response.reasoning_summary_part.added", **self._at(),
                                                 summary_index=0, part={"type": "summary_text", "text": ""})]
        item["content"] = []
        return [self._open(item), self.event("response.content_part.added", **self._at(), content_index=0,
                                             part={"type": "reasoning_text", "text": ""})]

    def open_message(self) -> list[dict]:
        item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        return [self._open(item), self.event("response.content_part.added", **self._at(), content_index=0,
                                             part=self._output_text(""))]

    def open_call(self, name: str) -> list[dict]:
        item = {"id": new_id("fc"), "type": "function_call", "call_id": new_id("call"), "name": name,
                "arguments": "", "status": "in_progress"}
        return [self._open(item)]

    def delta(self, text: str) -> list[dict]:
        self.text.append(text)
        kind = self._open_item()["type"]
        if kind == "function_call":
            return [self.event("response.function_call_arguments.delta", **self._at(), delta=text)]
        if kind == "message":
            logprobs = self._take_logprobs()
            return [self.event("response.output_text.delta", **self._at(), content_index=0, delta=text,
                               logprobs=logprobs)]
        if self.summary:
            return [self.event("response.reasoning_summary_text.delta", **self._at(), summary_index=0, delta=text)]
        return [self.event("response.reasoning_text.delta", **self._at(), content_index=0, delta=text)]

    def close(self, status: str = "completed") -> list[dict]:
        item = self.item
        if item is None:
            return []
        text, at, out = "".join(self.text), self._at(), []
        if item["type"] == "function_call":
            item["arguments"] = text
            out.append(self.event("response.function_call_arguments.done", **at, name=item["name"], arguments=text))
        elif item["type"] == "message":
            part = self._output_text(text)
            item["content"] = [part]
            out += [self.event("response.output_text.done", **at, content_index=0, text=text,
                               logprobs=part["logprobs"]),
                    self.event("response.content_part.done", **at, content_index=0, part=copy.deepcopy(part))]
        elif self.summary:
            part = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            out += [self.event("response.reasoning_summary_text.done", **at, summary_index=0, text=text),
                    self.event("response.reasoning_summary_part.done", **at, summary_index=0, part=dict(part))]
        else:
            part = {"type": "reasoning_text", "text": text}
            item["content"] = [part]
            out += [self.event("response.reasoning_text.done", **at, content_index=0, text=text),
                    self.event("response.content_part.done", **at, content_index=0, part=dict(part))]
        if item["type"] == "reasoning" and self.sealed:
            item["encrypted_content"] = seal(text)
        item["status"] = status
        out.append(self.event("response.output_item.done", output_index=self.index, item=copy.deepcopy(item)))
        self.item = None
        return out

    def _output_text(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(self.logprobs)}

    def _take_logprobs(self) -> list[dict]:
        if not self.pending or self.token_bytes is None:
            self.pending = []
            return []
        items = chat_logprobs(self.pending, self.token_bytes)["content"]
        self.pending = []
        self.logprobs += items
        return items


def usage_json(u: Usage) -> dict:
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}

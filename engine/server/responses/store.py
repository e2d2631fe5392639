"""ResponseStore: the Responses API's stored responses, in memory, bounded by count and bytes (LRU).

A stored response keeps the Response object (for GET) and its conversation as Responses items: every
earlier turn's input and output, then its own input and output, without the instructions (which the
API does not carry over). A turn naming it as `previous_response_id` continues that item list, so it
renders to the same prompt prefix and the engine's prefix cache serves it again.

Only the event loop touches the store, so it needs no lock.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

MAX_RESPONSES = 1000
MAX_BYTES = 64 * 1024 * 1024


@dataclass
class StoredResponse:
    response: dict          # the Response object as returned
    items: list[dict]       # the conversation through this response's output, as Responses items
    size: int               # bytes of both as JSON


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def put(self, response: dict, items: list[dict]) -> None:
        """Keep a response; the least recently used ones go while the store is over either bound (a
        response larger than the whole byte bound is not kept at all)."""
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(items, ensure_ascii=False))
        self.delete(response["id"])
        if size > self.max_bytes:
            return
        self.entries[response["id"]] = StoredResponse(response, items, size)
        self.bytes += size
        while len(self.entries) > self.max_responses or self.bytes > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.size

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self.entries.get(response_id)
        if entry is not None:
            self.entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self.entries.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size
        return entry is not None

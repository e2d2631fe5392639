"""RemoteBackend: the chat talks to an OpenAI-compatible server (vLLM, SGLang, another Qwen
Desk) instead of the local engine. Streams /chat/completions (server-sent events) on a thread
per reply, with the same signals as the EngineThread."""

from __future__ import annotations

import base64
import http.client
import json
import mimetypes
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from PySide6.QtCore import QObject, Signal

from app.generation import ReplyResult
from app.net import abort_connection, open_connection, request_target
from app.chat.attachments import image_problem

TIMEOUT_S = 120.0


class RemoteError(Exception):
    pass


class RemoteBackend(QObject):
    delta = Signal(str, str, str, int)      # request id, content text, reasoning text, tokens (a chunk: one)
    reply_finished = Signal(str, object)    # request id, ReplyResult
    warmed = Signal(int)                    # never sent: what a remote server keeps cached is its own

    supports_vision = True                  # the server decides; images are sent as data URLs
    max_context = None
    takes_tools = False                     # the chat's tools run with the local engine only

    def __init__(self, base_url: str, api_key: str = "", model: str = "", parent=None):
        super().__init__(parent)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self._connections: dict[str, http.client.HTTPConnection] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"{self.model or 'remote'} @ {urlsplit(self.base_url).netloc}"

    # ---- API ---------------------------------------------------------------------------------
    def writer(self) -> dict:
        """What writes the replies, as a message records it."""
        return {"name": self.label}

    def generate(self, request_id: str, messages: list[dict], params, template_kwargs: dict) -> None:
        threading.Thread(target=self._run, args=(request_id, messages, params, template_kwargs),
                         name=f"remote {request_id}", daemon=True).start()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)
            conn = self._connections.get(request_id)
        if conn is not None:
            abort_connection(conn)

    def count_tokens(self, messages: list[dict], template_kwargs: dict) -> None:
        """A remote server's tokenizer is not at hand: never counted (nor truncated) here."""
        return None

    def warm(self, messages: list[dict], template_kwargs: dict) -> None:
        """Nothing to do: what a remote server keeps cached is its own."""

    def list_models(self) -> list[str]:
        """The server's model ids (blocking: call it off the GUI thread)."""
        conn, response = self._request("GET", "/models", None)
        try:
            body = response.read()
        finally:
            conn.close()
        try:
            return [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            raise RemoteError("the server's /models answer is not OpenAI-shaped") from None

    # ---- one reply (its own thread) ----------------------------------------------------------
    def _run(self, request_id: str, messages, params, template_kwargs) -> None:
        started = time.monotonic()
        try:
            model = self.model or (self.list_models() or [""])[0]
            body = self._body(model, messages, params, template_kwargs)
            conn, response = self._request("POST", "/chat/completions", body)
        except (RemoteError, OSError) as e:
            self.reply_finished.emit(request_id, self._stopped(request_id, f"{e}"))
            return
        with self._lock:
            self._connections[request_id] = conn
            cancelled = request_id in self._cancelled
        if cancelled:
            abort_connection(conn)
        try:
            result = self._stream(request_id, response, started)
        except (OSError, ValueError) as e:
            result = self._stopped(request_id, f"the connection to {self.base_url} broke ({type(e).__name__})")
        finally:
            with self._lock:
                self._connections.pop(request_id, None)
            conn.close()
        self.reply_finished.emit(request_id, result)

    def _stopped(self, request_id: str, error: str) -> ReplyResult:
        with self._lock:
            if request_id in self._cancelled:
                self._cancelled.discard(request_id)
                return ReplyResult("cancelled")
        return ReplyResult("error", error=error)

    def _request(self, method: str, path: str, body: dict | None):
        url = self.base_url + path
        conn = open_connection(urlsplit(url), TIMEOUT_S)
        headers = {"Accept": "text/event-stream" if body and body.get("stream") else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, request_target(conn, url), body=data, headers=headers)
            response = conn.getresponse()
        except OSError as e:
            conn.close()
            raise RemoteError(f"cannot reach {self.base_url}: {e.strerror or type(e).__name__}") from None
        if response.status != 200:
            detail = _error_detail(response.read())
            conn.close()
            raise RemoteError(f"{self.base_url} answered {response.status}{': ' + detail if detail else ''}")
        return conn, response

    def _body(self, model: str, messages, params, template_kwargs) -> dict:
        body = {"model": model, "messages": [_openai_message(m) for m in messages], "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p,
                "presence_penalty": params.presence_penalty}
        if params.top_k:
            body["top_k"] = params.top_k                       # vLLM / SGLang extensions
        if params.min_p:
            body["min_p"] = params.min_p
        template_kwargs = dict(template_kwargs)
        if template_kwargs.pop("continue_final_message", False):      # vLLM / SGLang: continue the last message
            body.update(continue_final_message=True, add_generation_prompt=False)
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        return body

    def _stream(self, request_id: str, response, started: float) -> ReplyResult:
        first_at, usage, finish = None, None, None
        tool_calls: dict[int, dict] = {}
        for line in response:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                d = choice.get("delta") or {}
                text = d.get("content") or ""
                reasoning = d.get("reasoning_content") or d.get("reasoning") or ""
                if text or reasoning:
                    first_at = first_at or time.monotonic()
                    self.delta.emit(request_id, text, reasoning, 1)
                for call in d.get("tool_calls") or []:
                    first_at = first_at or time.monotonic()
                    slot = tool_calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.get("id") or slot["id"]
                    fn = call.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        with self._lock:
            if request_id in self._cancelled:
                self._cancelled.discard(request_id)
                finish = "cancelled"
        if finish is None:
            raise ValueError("the stream ended early")
        return ReplyResult("stop" if finish == "tool_calls" else finish,
                           tool_calls=[tool_calls[i] for i in sorted(tool_calls)],
                           metrics=_metrics(usage, started, first_at))


def _openai_message(message: dict) -> dict:
    images = [path for path in message.get("images") or () if not image_problem(path)]   # the transcript marks them
    if not images:
        return {"role": message["role"], "content": message["content"]}
    parts = [{"type": "text", "text": message["content"]}] if message["content"] else []
    for path in images:
        mime = mimetypes.guess_type(path)[0] or "image/png"
        data = base64.b64encode(Path(path).read_bytes()).decode()
        parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
    return {"role": message["role"], "content": parts}


def _metrics(usage: dict | None, started: float, first_at: float | None) -> dict:
    now = time.monotonic()
    metrics = {"total_ms": 1e3 * (now - started)}
    if first_at:
        metrics["ttft_ms"] = 1e3 * (first_at - started)
    if usage:
        out = usage.get("completion_tokens", 0)
        metrics.update(prompt_tokens=usage.get("prompt_tokens", 0), output_tokens=out,
                       cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0)
        if first_at and out > 1 and now > first_at:
            metrics["tok_s"] = (out - 1) / (now - first_at)
    return metrics


def _error_detail(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
        return str((error.get("message") or "") if isinstance(error, dict) else (error or ""))[:300]
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace").strip()

"""ChatBackend: what the chat session asks of whatever writes its replies, the EngineThread (the local engine) or a
RemoteBackend (an OpenAI-compatible server). Signals carry the answers, on the GUI thread."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from PySide6.QtCore import SignalInstance

from engine.api import SamplingParams


@runtime_checkable
class ChatBackend(Protocol):
    delta: SignalInstance            # request id, content text, reasoning text, tokens it carries
    reply_finished: SignalInstance   # request id, ReplyResult
    warmed: SignalInstance           # prompt tokens a conversation's next turn reuses (a remote one never says)
    takes_tools: bool                # generate()'s template_kwargs may hold "tools" (rendered and parsed by it)

    @property
    def supports_vision(self) -> bool:
        """The model takes images."""
        ...

    @property
    def max_context(self) -> int | None:
        """Tokens per sequence; None: unknown (nothing is counted or left out then)."""
        ...

    def writer(self) -> dict:
        """What writes the replies now, as a message records it (name; the local engine adds weights and drafts)."""
        ...

    def generate(self, request_id: str, messages: list[dict], params: SamplingParams, template_kwargs: dict) -> None:
        """Start a reply; it streams as `delta` and ends with one `reply_finished`."""
        ...

    def cancel(self, request_id: str) -> None:
        ...

    def warm(self, messages: list[dict], template_kwargs: dict) -> None:
        """Ahead of a conversation's next turn: its cached prefix made ready (`warmed` says how much)."""
        ...

    def count_tokens(self, messages: list[dict], template_kwargs: dict) -> int | None:
        """The prompt's tokens as the model would run it; None when the backend cannot count them."""
        ...

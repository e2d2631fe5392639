"""Responses API requests -> the chat completions request the OpenAI route already serves.

A Responses request becomes a ChatCompletionRequest (instructions as the leading system message,
the items as chat messages, flat function tools nested, `text.format` as `response_format`,
`reasoning.effort` as `reasoning_effort`), and goes through `engine.server.openai.convert.chat_request`: the same
checks, tool-call handling, images and structured output as chat. Errors raised on the chat side name
the chat field; `Renames` turns them back into the Responses field the client sent.

Items -> chat messages: an assistant turn is the run of reasoning, assistant message and
function_call items that the API returns for it (reasoning becomes its `reasoning_content`, calls its
`tool_calls`); a function_call_output is a tool message; user / system / developer messages pass as
they are, their parts as the chat API's (input_image as an image_url part).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.api import call_arguments
from engine.server.http.errors import APIError, validation_error
from engine.server.bridge.images import ImageOptions
from engine.server.openai.convert import chat_request
from engine.server.openai.schema import ChatCompletionRequest
from engine.server.bridge.prompting import ChatRequest
from engine.server.responses.schema import (FunctionCallItem, FunctionCallOutputItem, FunctionTool, MessageItem,
                                            ReasoningItem, ResponsesRequest)

INCLUDES = ("reasoning.encrypted_content", "message.output_text.logprobs")
REFUSED = {
    "background": "background responses are not supported: wait for the response or stream it",
    "conversation": "the Conversations API is not served here: chain turns with previous_response_id",
    "prompt": "stored prompt templates are not served here: send instructions and input",
    "context_management": "server-side context compaction is not supported",
}
# The reasoning a response returns as `encrypted_content` (include: reasoning.encrypted_content) is this
# prefix and the text in base64: opaque, not secret; it exists so that a client keeping no state
# (store: false) can send the reasoning back.
SEALED = "qwendesk-reasoning:"
TEXT_PARTS = ("input_text", "output_text", "text")
# chat request field -> the Responses field it came from
FIELDS = {"messages": "input", "response_format": "text.format", "max_completion_tokens": "max_output_tokens",
          "reasoning_effort": "reasoning.effort", "top_logprobs": "top_logprobs", "logprobs": "include"}


@dataclass
class Prepared:
    chat: ChatRequest
    items: list[dict]           # the conversation so far as Responses items (earlier turns', then this input)
    tools: list[dict]           # the tools as given, checked (echoed in the Response)
    renames: Renames          # for the errors that rendering and submitting the chat request raise


def prepare(body: ResponsesRequest, history: list[dict], vocab_size: int, images: ImageOptions) -> Prepared:
    """`history`: the items of the response named by previous_response_id ([] if none)."""
    refuse_unsupported(body)
    given = body.input
    items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else list(given or [])
    if not items and not history:
        raise APIError(400, "input is required", param="input")
    conversation = history + items
    messages, sources = chat_messages(conversation, len(history))
    if body.instructions:
        messages.insert(0, {"role": "system", "content": body.instructions})
        sources.insert(0, "instructions")
    if not messages:
        raise APIError(400, "input holds no message", param="input")
    tools = [_check(FunctionTool, t, f"tools.{i}") if t.get("type") == "function" else _refuse_tool(t, i)
             for i, t in enumerate(body.tools or [])]
    logprobs = "message.output_text.logprobs" in (body.include or [])
    chat = {"model": body.model, "messages": messages,
            "tools": [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                      for t in tools] or None,
            "tool_choice": tool_choice(body.tool_choice), "parallel_tool_calls": body.parallel_tool_calls,
            "reasoning_effort": body.reasoning.effort if body.reasoning else None,
            "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
            "response_format": response_format(body.text.format if body.text else None),
            "logprobs": logprobs, "top_logprobs": body.top_logprobs if logprobs else None,
            "user": body.user}
    renames = Renames(sources, len(history))
    try:
        req = chat_request(ChatCompletionRequest.model_validate(chat), vocab_size, images)
    except ValidationError as e:
        raise renames(validation_error(e.errors())) from None
    except APIError as e:
        raise renames(e) from None
    return Prepared(req, conversation, [t.model_dump(exclude_none=True) for t in tools], renames)


def response_format(fmt: dict | None) -> dict | None:
    """`text.format` -> chat's `response_format` (the Responses API has json_schema's fields flat)."""
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}} \
        if fmt and fmt.get("type") == "json_schema" else fmt


def refuse_unsupported(body: ResponsesRequest) -> None:
    given = [k for k, v in (body.model_extra or {}).items() if v not in (None, False, [], {})]   # null: absent
    if given:
        raise APIError(400, REFUSED.get(given[0], f"{given[0]} is not supported by this server"), param=given[0])
    if body.background:
        raise APIError(400, REFUSED["background"], param="background")
    if body.truncation == "auto":
        raise APIError(400, "truncation 'auto' is not supported: the conversation must fit the model's context "
                            "(drop earlier items, or start a new chain)", param="truncation")
    bad = [i for i in body.include or [] if i not in INCLUDES]
    if bad:
        raise APIError(400, f"include {bad[0]!r} is not supported (supported: {', '.join(INCLUDES)})", param="include")
    for key, value in (body.metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise APIError(400, "metadata keys are at most 64 characters and values at most 512", param="metadata")


def tool_choice(choice):
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, f"tool_choice {choice.get('type')!r} is not supported: use auto, none, required or "
                        "{type: function, name}", param="tool_choice")


def _refuse_tool(tool: dict, i: int):
    raise APIError(400, f"tool type {tool.get('type')!r} is not available here (built-in tools run on OpenAI's "
                        "servers); define function tools", param=f"tools.{i}.type")


# ---- items -> chat messages ------------------------------------------------------------------------
def chat_messages(items: list[dict], n_history: int) -> tuple[list[dict], list]:
    """-> (chat messages, the index in `items` each message starts at)."""
    messages: list[dict] = []
    sources: list[int | str] = []
    turn: dict[str, Any] | None = None

    def where(j: int) -> str:
        return "previous_response_id" if j < n_history else f"input.{j - n_history}"

    for j, item in enumerate(items):
        kind = item.get("type", "message")
        assistant = kind in ("reasoning", "function_call") or (kind == "message" and item.get("role") == "assistant")
        if assistant:
            if turn is None or (kind != "function_call" and "tool_calls" in turn) or (
                    kind == "reasoning" and turn["content"]):
                turn = {"role": "assistant", "content": ""}
                messages.append(turn)
                sources.append(j)
            if kind == "reasoning":
                turn["reasoning_content"] = turn.get("reasoning_content", "") + reasoning_text(item, where(j))
            elif kind == "function_call":
                turn.setdefault("tool_calls", []).append(function_call(item, where(j)))
            else:
                turn["content"] += assistant_text(item, where(j))
            continue
        turn = None
        if kind == "message":
            m = _check(MessageItem, item, where(j))
            messages.append({"role": m.role, "content": parts(m.content, f"{where(j)}.content")})
        elif kind == "function_call_output":
            out = _check(FunctionCallOutputItem, item, where(j))
            messages.append({"role": "tool", "tool_call_id": out.call_id,
                             "content": parts(out.output, f"{where(j)}.output")})
        elif kind == "item_reference":
            raise APIError(400, "item_reference is not supported: send the item itself, or chain the turn with "
                                "previous_response_id", param=where(j))
        else:
            raise APIError(400, f"input item type {kind!r} is not supported here", param=f"{where(j)}.type")
        sources.append(j)
    return messages, sources


def function_call(item: dict, where: str) -> dict:
    call = _check(FunctionCallItem, item, where)
    try:
        call_arguments(call.arguments)
    except ValueError as e:
        raise APIError(400, f"{where}.arguments {e}", param=f"{where}.arguments") from None
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def assistant_text(item: dict, where: str) -> str:
    m = _check(MessageItem, item, where)
    if isinstance(m.content, str):
        return m.content
    out = []
    for k, p in enumerate(m.content):
        if p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str):
            out.append(p["text"])
        elif p.get("type") == "refusal" and isinstance(p.get("refusal"), str):
            out.append(p["refusal"])
        else:
            raise APIError(400, f"assistant content part type {p.get('type')!r} is not supported",
                           param=f"{where}.content.{k}")
    return "".join(out)


def parts(content: str | list[dict], where: str):
    """Input parts -> the chat API's content parts, in the same order (so an error there names the part)."""
    if isinstance(content, str):
        return content
    out = []
    for k, p in enumerate(content):
        kind = p.get("type")
        if kind in TEXT_PARTS and isinstance(p.get("text"), str):
            out.append({"type": "text", "text": p["text"]})
        elif kind == "input_image" and isinstance(p.get("image_url"), str):
            out.append({"type": "image_url", "image_url": {"url": p["image_url"], "detail": p.get("detail", "auto")}})
        elif kind == "input_image":
            raise APIError(400, "input_image needs an image_url (an http(s) or data: URL); file ids are not served",
                           param=f"{where}.{k}")
        else:
            raise APIError(400, f"content part type {kind!r} is not supported", param=f"{where}.{k}")
    return out


def reasoning_text(item: dict, where: str) -> str:
    """The reasoning an earlier turn returned: its reasoning_text, else its sealed copy, else its summary."""
    r = _check(ReasoningItem, item, where)
    if r.content:
        return "".join(_texts(r.content, "reasoning_text"))
    if r.encrypted_content:
        return unseal(r.encrypted_content, f"{where}.encrypted_content")
    return "\n\n".join(_texts(r.summary, "summary_text"))


def _texts(parts: list[dict], kind: str) -> list[str]:
    return [p["text"] for p in parts if p.get("type") == kind and isinstance(p.get("text"), str)]


def seal(text: str) -> str:
    return SEALED + base64.b64encode(text.encode("utf-8", "replace")).decode()


def unseal(sealed: str, where: str) -> str:
    try:
        if sealed.startswith(SEALED):
            return base64.b64decode(sealed[len(SEALED):], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        pass
    raise APIError(400, "encrypted_content was not made by this server", param=where)


def _check(model: type[BaseModel], data: dict, where: str):
    """A part of the request checked against its model, an error naming it from the top (`input.3.call_id`)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = validation_error(e.errors())
        if not err.param:
            raise APIError(400, f"{where}: {err.message}", param=where) from None
        param = f"{where}.{err.param}"
        raise APIError(400, err.message.replace(err.param, param, 1), param=param) from None


class Renames:
    """An error the chat side raised, naming the field of the Responses request it came from."""

    def __init__(self, sources: list, n_history: int):
        self.labels = [s if isinstance(s, str) else "previous_response_id" if s < n_history
                       else f"input.{s - n_history}" for s in sources]

    def __call__(self, err: APIError) -> APIError:
        param = err.param or ""
        new: str | None
        head, _, rest = param.partition(".")
        if head == "messages" and rest:
            index, _, tail = rest.partition(".")
            label = self.labels[int(index)] if index.isdigit() and int(index) < len(self.labels) else "input"
            new = label if label in ("instructions", "previous_response_id") or not tail else f"{label}.{tail}"
        elif head == "tools" and ".function" in param:
            new = param.replace(".function", "", 1)
        else:
            new = FIELDS.get(param, param) or None
        if new != (err.param or None):
            err.message = err.message.replace(param, new) if new is not None and param in err.message else err.message
            err.param = new
        return err

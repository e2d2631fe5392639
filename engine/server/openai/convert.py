"""OpenAI request bodies -> the neutral ChatRequest / sampling fields the engine side takes."""

from __future__ import annotations

from typing import Any

from engine.api import call_arguments
from engine.server.bridge.checks import OPENAI_CHAT, check_tool_schema, refuse_unsupported
from engine.server.http.errors import APIError
from engine.server.bridge.images import ImageOptions, ImageParts
from engine.server.openai.schema import (ChatCompletionRequest, ChatMessage, ContentPart, FunctionName, NamedToolChoice,
                                        SamplingFields, Tool, ToolCall)
from engine.server.bridge.processors import LogitBias
from engine.server.bridge.prompting import ChatRequest, Thinking, ToolChoice
from engine.server.bridge.structured import response_constraint

IMAGE_PARTS = ("image_url", "input_image")     # chat's, and the Responses API's spelling


def chat_request(body: ChatCompletionRequest, vocab_size: int, images: ImageOptions) -> ChatRequest:
    refuse_unsupported(body.model_extra, OPENAI_CHAT)
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    sampling = sampling_fields(body, vocab_size)
    if body.logprobs:
        sampling["logprobs"] = body.top_logprobs or 0
    tools, choice, parallel = legacy_functions(body)
    for i, tool in enumerate(tools or []):
        check_tool_schema(tool.function.parameters, f"tools.{i}.function.parameters" if body.tools
                          else f"functions.{i}.parameters")
    if choice is None:
        mode, name = ("auto" if tools else "none"), None
    elif isinstance(choice, str):
        mode, name = choice, None
    else:
        mode, name = "function", choice.function.name
    return ChatRequest(
        messages=template_messages(body.messages, ImageParts(images)),
        sampling=sampling,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        tools=[t.model_dump(exclude_none=True) for t in tools] if tools else None,
        tool_choice=ToolChoice(mode, name, parallel),
        thinking=Thinking(effort=body.reasoning_effort, budget=body.thinking_token_budget),
        template_kwargs=dict(body.chat_template_kwargs or {}),
        json_format=response_constraint(body.response_format),
        images=images,
    )


def legacy_functions(body: ChatCompletionRequest) -> tuple:
    """-> (tools, tool_choice, parallel): the request's own, or its legacy `functions` / `function_call` as
    tools (one call at most, as that API returns it in `message.function_call`)."""
    if body.functions is None and body.function_call is None:
        return body.tools, body.tool_choice, body.parallel_tool_calls is not False
    if body.tools is not None or body.tool_choice is not None:
        raise APIError(400, "functions / function_call cannot be mixed with tools / tool_choice",
                       param="functions" if body.functions is not None else "function_call")
    tools = [Tool(function=f) for f in body.functions or []]
    choice = body.function_call
    return tools, NamedToolChoice(function=choice) if isinstance(choice, FunctionName) else choice, False


def sampling_fields(body: SamplingFields, vocab_size: int) -> dict:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    fields: dict[str, Any] = dict(temperature=body.temperature, top_p=body.top_p,
                  top_k=0 if body.top_k == -1 else body.top_k, min_p=body.min_p,
                  presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                  repetition_penalty=body.repetition_penalty,
                  seed=None if body.seed is None else body.seed % 2 ** 63,
                  stop=stop, stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos)
    bad = [t for t in fields["stop_token_ids"] if not 0 <= t < vocab_size]
    if bad:
        raise APIError(400, f"stop_token_ids holds {bad[0]}, which is not a token id (0..{vocab_size - 1})",
                       param="stop_token_ids")
    if body.logit_bias:
        fields["logits_processors"] = [LogitBias(logit_bias(body.logit_bias, vocab_size))]
    return fields


def logit_bias(given: dict[str, float], vocab_size: int) -> dict[int, float]:
    bias = {}
    for key, value in given.items():
        if not key.strip().isdigit() or int(key) >= vocab_size:
            raise APIError(400, f"logit_bias key {key!r} is not a token id (0..{vocab_size - 1})", param="logit_bias")
        if not -100 <= value <= 100:
            raise APIError(400, f"logit_bias values must be in [-100, 100], got {value}", param="logit_bias")
        bias[int(key)] = value
    return bias


def template_messages(messages: list[ChatMessage], images: ImageParts) -> list[dict]:
    """OpenAI messages -> the chat template's: developer is system, leading system messages merge,
    tool-call arguments become objects, earlier reasoning goes back as reasoning_content, image parts become the
    engine's (server/bridge/images.py)."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        content = _content(m.content, f"messages.{i}.content", images)
        if role == "system" and out and all(o["role"] == "system" for o in out):
            out[0]["content"] = _join(out[0]["content"], content)
            continue
        msg = {"role": role, "content": content}
        if role == "assistant":
            calls = m.tool_calls or ([ToolCall(function=m.function_call)] if m.function_call else [])
            if calls:
                msg["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.function.name,
                                                   "arguments": _arguments(c.function.arguments, i, j)}}
                                     for j, c in enumerate(calls)]
            reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
            if reasoning is not None:
                msg["reasoning_content"] = reasoning
        elif role == "tool":
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def _content(content: str | list[ContentPart] | None, where: str, images: ImageParts):
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for k, part in enumerate(content):
        if part.type in ("text", "input_text") and part.text is not None:
            parts.append({"type": "text", "text": part.text})
        elif part.type in IMAGE_PARTS:
            parts.append(images.from_url(part.image_url, f"{where}.{k}"))
        else:
            raise APIError(400, f"content part type {part.type!r} is not supported (text and images)",
                           param=f"{where}.{k}")
    return parts


def _join(a, b) -> str:
    """Two system contents as one."""
    return _text(a) + "\n\n" + _text(b)


def _text(content) -> str:
    if isinstance(content, list) and any(p["type"] != "text" for p in content):
        raise APIError(400, "system messages cannot contain images", param="messages")
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def _arguments(arguments: str | dict, i: int, j: int) -> dict:
    where = f"messages.{i}.tool_calls.{j}.function.arguments"
    try:
        return call_arguments(arguments)
    except ValueError as e:
        raise APIError(400, f"{where} {e}", param=where) from None

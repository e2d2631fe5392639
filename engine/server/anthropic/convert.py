"""Anthropic request bodies -> the neutral ChatRequest the engine side takes.

Thinking follows the Messages API: off unless `thinking` asks for it ("enabled" with its
budget_tokens, "adaptive"). A trailing assistant message is a prefill: the reply continues it
(with thinking off, as the API requires).
"""

from __future__ import annotations

from engine.server.anthropic.schema import Block, CountTokensRequest, MessagesRequest
from engine.server.bridge.checks import check_tool_schema
from engine.server.http.errors import APIError
from engine.server.bridge.images import ImageOptions, ImageParts
from engine.server.bridge.prompting import ChatRequest, Thinking, ToolChoice
from engine.server.bridge.structured import response_constraint

CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}


def chat_request(body: CountTokensRequest, images: ImageOptions) -> ChatRequest:
    tools = [_tool(t, f"tools.{i}.input_schema") for i, t in enumerate(body.tools or [])]
    choice = ToolChoice("auto" if tools else "none")
    if body.tool_choice is not None:
        if body.tool_choice.type == "tool" and not body.tool_choice.name:
            raise APIError(400, "tool_choice.name is required when tool_choice.type is 'tool'",
                           param="tool_choice.name")
        choice = ToolChoice(CHOICES[body.tool_choice.type], body.tool_choice.name,
                            not body.tool_choice.disable_parallel_tool_use)
    out = body.output_config
    if out is not None and out.format is not None and body.output_format is not None:
        raise APIError(400, "give output_config.format or output_format, not both", param="output_format")
    fmt, param = ((out.format, "output_config.format") if out is not None and out.format is not None
                  else (body.output_format, "output_format"))
    messages, prefill = template_messages(body.system, body.messages, ImageParts(images))
    req = ChatRequest(messages=messages, sampling={}, tools=tools or None, tool_choice=choice,
                      thinking=_thinking(body), prefill=prefill, json_format=response_constraint(fmt, param),
                      images=images)
    if isinstance(body, MessagesRequest):
        budget = req.thinking.budget
        if budget is not None and budget >= body.max_tokens:     # (Anthropic's rule: the budget is part of max_tokens)
            raise APIError(400, f"thinking.budget_tokens ({budget}) must be less than max_tokens ({body.max_tokens})",
                           param="thinking.budget_tokens")
        req.max_tokens = body.max_tokens
        req.sampling = dict(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                            stop=list(body.stop_sequences or []))
    return req


def _thinking(body: CountTokensRequest) -> Thinking:
    effort = body.output_config.effort if body.output_config else None
    t = body.thinking
    if t is None or t.type == "disabled":
        return Thinking(enabled=False, effort=effort)
    return Thinking(enabled=True, effort=effort, budget=t.budget_tokens if t.type == "enabled" else None)


def _tool(tool, where: str) -> dict:
    if tool.type not in (None, "custom"):
        raise APIError(400, f"server tool {tool.type!r} is not available here; define client tools with an "
                            "input_schema", param="tools")
    check_tool_schema(tool.input_schema, where)
    schema = tool.input_schema or {"type": "object", "properties": {}}
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description or "", "parameters": schema}}


def template_messages(system, messages, images: ImageParts) -> tuple[list[dict], str]:
    """-> (the chat template's messages, the prefill). tool_result blocks become tool messages,
    tool_use blocks the assistant's tool_calls, thinking blocks its reasoning_content, image blocks (in user turns)
    the engine's image parts."""
    out: list[dict] = []
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else
                    _texts(system, "system")})
    prefill = ""
    for i, m in enumerate(messages):
        where = f"messages.{i}.content"
        blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "user":
            texts = []
            for j, b in enumerate(blocks):
                if b.type == "tool_result":
                    out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": _result(b, f"{where}.{j}")})
                elif b.type == "image":
                    texts.append(images.from_source(b.source, f"{where}.{j}"))
                else:
                    texts.append(_text_part(b, f"{where}.{j}"))
            if texts or not blocks:
                out.append({"role": "user", "content": texts})
        elif i == len(messages) - 1 and all(b.type == "text" for b in blocks):
            prefill = "".join(b.text or "" for b in blocks)
        else:
            out.append(_assistant(blocks, where))
    return out, prefill


def _assistant(blocks: list[Block], where: str) -> dict:
    texts, reasoning, calls = [], [], []
    for j, b in enumerate(blocks):
        if b.type == "thinking":
            reasoning.append(b.thinking or "")
        elif b.type == "redacted_thinking":
            continue
        elif b.type == "tool_use":
            if not b.name:
                raise APIError(400, f"{where}.{j}.name is required", param=f"{where}.{j}.name")
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input or {}}})
        else:
            texts.append(_text_part(b, f"{where}.{j}"))
    msg = {"role": "assistant", "content": texts}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _text_part(b: Block, where: str) -> dict:
    if b.type == "text":
        return {"type": "text", "text": b.text or ""}
    if b.type == "image":
        raise APIError(400, "images are taken in user messages only", param=where)
    raise APIError(400, f"content block type {b.type!r} is not supported here", param=where)


def _texts(blocks: list[Block], where: str) -> str:
    return "\n".join(_text_part(b, f"{where}.{j}")["text"] for j, b in enumerate(blocks))


def _result(b: Block, where: str) -> str:
    content = b.content if isinstance(b.content, str) else _texts(b.content or [], f"{where}.content")
    return f"Error: {content}" if b.is_error else content

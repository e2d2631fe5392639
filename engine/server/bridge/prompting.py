"""From an API request to what the engine runs: the prompt's token ids and the sampling parameters.

Both APIs arrive here with chat messages in the template's own terms (system / user / assistant /
tool roles, assistant `tool_calls` with arguments as objects, `reasoning_content`), OpenAI-style
tool definitions, and their options in neutral form.

Decisions:
- tool_choice "none": the tools stay in the prompt (it then shares its cached prefix with the turns
  that may call them) and the <tool_call> token is banned.
- tools with tool_choice auto / required / a named function, and a structured output format: the engine's
  Constraint (structured.py): decoded under a grammar, so the reply's calls (and its JSON) always parse and
  validate. A named function or parallel_tool_calls false: one call, then the reply ends.
- reasoning effort: "none" turns thinking off; the value also reaches the template as
  `reasoning_effort`. A template without that knob (Qwen3.5's) gets a thinking budget instead for
  the low efforts (EFFORT_BUDGETS); medium and up think freely.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.api import Constraint, ImageInputError, SamplingParams, split_images, tool_schemas
from engine.server.http.errors import APIError
from engine.server.bridge.images import ImageOptions, fetch_images
from engine.server.bridge.processors import BanTokens
from engine.server.bridge.structured import request_constraint

EFFORT_BUDGETS = {"minimal": 256, "low": 1024}
RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt", "template_name", "continue_final_message")
PIECE_EDGE_TOKENS = 8       # tokens one cut through a text may add to its count, at most (encode)
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class ToolChoice:
    mode: str = "auto"              # none | auto | required | function
    name: str | None = None         # the function, for mode "function"
    parallel: bool = True


@dataclass
class Thinking:
    enabled: bool | None = None     # None: the template's default (Qwen3.5: on)
    effort: str | None = None
    budget: int | None = None       # reasoning tokens before </think> is forced


@dataclass
class Prompt:
    ids: list[int]
    params: SamplingParams
    tools: list[dict] | None        # the tools whose calls the engine parses out of the reply; None: no parsing
    images: list = field(default_factory=list)   # the engine's ProcessedImages of an expanded prompt


@dataclass
class ChatRequest:
    messages: list[dict]
    sampling: dict                  # SamplingParams fields given by the client (None: not given)
    max_tokens: int | None = None   # None: whatever room the context leaves
    tools: list[dict] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    thinking: Thinking = field(default_factory=Thinking)
    template_kwargs: dict = field(default_factory=dict)
    prefill: str = ""               # text the reply continues (Anthropic's trailing assistant message)
    json_format: Constraint | None = None   # structured output (structured.py response_constraint)
    images: ImageOptions | None = None   # what its image parts may be (None: it has none)
    special_text: bool = False      # special-token text in its messages is plain text (ServerSettings.special_text)


def generation_defaults(model_dir: str) -> dict:
    """The checkpoint's recommended sampling (generation_config.json) for what a request leaves unset."""
    try:
        config = json.loads((Path(model_dir) / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: config[k] for k in GENERATION_DEFAULTS if isinstance(config.get(k), (int, float))
            and not isinstance(config.get(k), bool)}


def sampling_params(given: dict, defaults: dict) -> SamplingParams:
    values = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    fields: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in values.items()}
    params = SamplingParams(**fields)
    try:
        params.validate()
    except ValueError as e:
        raise APIError(400, str(e)) from None
    return params


def chat_prompts(engine, req: ChatRequest, defaults: dict, n: int = 1) -> list[Prompt]:
    """Render, tokenize and check one chat request (on the Workers: templates and images can be slow), as n samples:
    the prompt made once, each sample with its own processors (they keep state) and its own seed (seed + i, when
    the client gave one)."""
    ids, images = prompt_ids(engine, req)
    tools = req.tools if req.tool_choice.mode != "none" else None
    return [Prompt(list(ids), chat_params(engine, req, defaults, len(ids), i), tools, images) for i in range(n)]


def chat_params(engine, req: ChatRequest, defaults: dict, prompt_tokens: int, sample: int) -> SamplingParams:
    params = sampling_params(req.sampling, defaults)
    params.max_tokens = completion_room(engine, prompt_tokens, req.max_tokens)
    params.thinking_budget = thinking_budget(engine, req.thinking)
    choice = req.tool_choice
    params.constraint = request_constraint(req.json_format, req.tools, choice.mode, choice.name, choice.parallel)
    params.logits_processors = tool_processors(engine.tokenizer, req.tools, choice) + params.logits_processors
    if params.seed is not None:
        params.seed = (params.seed + sample) % 2 ** 63
    return params


def prompt_ids(engine, req: ChatRequest) -> tuple[list, list]:
    """The prompt's token ids, each image's placeholder expanded, and its images (the engine's): URL images fetched
    (server/bridge/images.py), the pixels read by the engine; a bad image is a 400."""
    messages = fetch_images(req.messages, req.images) if req.images and req.images.allow_urls else req.messages
    messages, data = split_images(messages)
    try:
        images = engine.process_images(data)
    except ImageInputError as e:
        raise APIError(400, str(e), param="messages") from None
    ids = render(engine, dataclasses.replace(req, messages=messages))
    try:
        return engine.expand_images(ids, images), images
    except ImageInputError as e:
        raise APIError(400, str(e), param="messages") from None


def render(engine, req: ChatRequest) -> list[int]:
    """The prompt's token ids: the checkpoint's chat template, then the prefill."""
    tools, choice = req.tools or None, req.tool_choice
    if choice.mode in ("required", "function") and not tools:
        raise APIError(400, f"tool_choice {choice.mode!r} needs tools", param="tool_choice")
    if choice.mode == "function" and choice.name not in tool_schemas(tools):
        raise APIError(400, f"tool_choice names {choice.name!r}, which is not one of the tools", param="tool_choice")
    kwargs = template_kwargs(engine, req)
    messages, placeholders = escape_special(engine.tokenizer, req.messages) if req.special_text else (req.messages, {})
    text = render_messages(engine, messages, tools, kwargs)
    return encode(engine.tokenizer, text + req.prefill, engine.max_context, placeholders)


def render_messages(engine, messages: list[dict], tools, kwargs: dict) -> str:
    """The chat template's text; where it refuses the conversation, again with later system messages as user ones."""
    try:
        return engine.template.render(messages, tools=tools, add_generation_prompt=True, **kwargs)
    except ValueError as e:
        error = e
    moved = later_system_as_user(messages)
    if moved is not None:
        try:
            return engine.template.render(moved, tools=tools, add_generation_prompt=True, **kwargs)
        except ValueError:
            pass
    raise APIError(400, f"the conversation does not fit the model's chat template: {error}", param="messages")


def later_system_as_user(messages: list[dict]) -> list[dict] | None:
    """The conversation with each system message after the first message made a user message, where it stands (a
    template that takes a system message only at the start, as Qwen's, refuses the others: agents' retries append
    one after the user's turn); None when there is none."""
    later = [i for i, m in enumerate(messages) if i > 0 and m.get("role") == "system"]
    if not later:
        return None
    return [{**m, "role": "user"} if i in later else m for i, m in enumerate(messages)]


def escape_special(tok, messages: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """The messages with each special token's text (<|im_start|>, <tool_call>, <think>, ...) in the text of system,
    user and tool messages replaced by a placeholder character, and placeholder -> that text: `encode` then writes it
    as plain text, so a client's text cannot open a turn of another role or a tool call (the template's own tokens
    stay control tokens)."""
    specials = sorted((t.content for t in tok.backend.get_added_tokens_decoder().values()), key=len, reverse=True)
    texts: list[str] = []

    def collect(text: str) -> str:
        texts.append(text)
        return text

    map_texts(messages, collect)
    free = (chr(c) for c in range(0xF0000, 0xFFFFE) if not any(chr(c) in t for t in texts))
    marks: dict[str, str] = {}                  # special token's text -> its placeholder

    def escape(text: str) -> str:
        for special in specials:
            if special in text:
                marks.setdefault(special, next(free))
                text = text.replace(special, marks[special])
        return text

    return map_texts(messages, escape), {mark: special for special, mark in marks.items()}


def map_texts(messages: list[dict], fn) -> list[dict]:
    """The messages with fn applied to the text of each system, user and tool message (a string, or text parts)."""
    out = []
    for m in messages:
        content = m.get("content")
        if m.get("role") in ("system", "user", "tool"):
            if isinstance(content, str):
                m = {**m, "content": fn(content)}
            elif isinstance(content, list):
                m = {**m, "content": [{**p, "text": fn(p["text"])} if isinstance(p, dict) and isinstance(
                    p.get("text"), str) else p for p in content]}
        out.append(m)
    return out


def encode(tok, text: str, limit: int, placeholders: dict[str, str] | None = None) -> list[int]:
    """The text's token ids; each of `placeholders` (escape_special) as its text written plainly, in two pieces that
    no added token matches. A text far longer than `limit` tokens (the context) is refused after about `limit` of its
    tokens are counted, piece by piece, rather than tokenized whole (30 MB of text: tens of seconds and gigabytes)."""
    if placeholders:
        ids = []
        for i, part in enumerate(re.split("([" + "".join(placeholders) + "])", text)):
            if i % 2:
                ids += tok.encode(placeholders[part][:1]) + tok.encode(placeholders[part][1:])
            elif part:
                ids += encode(tok, part, limit)
        return ids
    try:
        text.isascii() or text.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, "the request holds text that is not valid Unicode (a lone surrogate)") from None
    piece = max(4096, 4 * limit)
    if len(text) > 2 * piece:
        counted = 0
        for cuts, start in enumerate(range(0, len(text), piece)):
            counted += len(tok.encode(text[start:start + piece]))
            if counted - PIECE_EDGE_TOKENS * cuts > limit:      # (a cut can add a token or two where it splits a word)
                raise context_exceeded(limit, f"more than {limit}", None)
    return tok.encode(text)


def context_exceeded(ctx: int, prompt_tokens, max_tokens: int | None) -> APIError:
    asked = prompt_tokens + (max_tokens or 1) if isinstance(prompt_tokens, int) else prompt_tokens
    return APIError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                         f"{asked} tokens ({prompt_tokens} in the prompt, {max_tokens or 1} for the "
                         f"completion). Please reduce the length of the prompt or of max_tokens.",
                    param="messages", code="context_length_exceeded")


def template_kwargs(engine, req: ChatRequest) -> dict:
    kwargs = dict(req.template_kwargs)
    bad = [k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS]
    if bad:
        raise APIError(400, f"chat_template_kwargs cannot set {bad[0]!r}", param="chat_template_kwargs")
    t = req.thinking
    enabled = False if t.effort == "none" else t.enabled
    if req.prefill:
        kwargs["enable_thinking"] = False       # the reply continues the given text, not a thinking block
    elif enabled is not None:
        kwargs.setdefault("enable_thinking", enabled)
    if t.effort and t.effort != "none":
        kwargs.setdefault("reasoning_effort", t.effort)
    return kwargs


def thinking_budget(engine, thinking: Thinking) -> int | None:
    if thinking.budget is not None:
        return thinking.budget
    knows_effort = any("reasoning_effort" in source for source in engine.template.sources.values())
    return None if knows_effort or thinking.effort is None else EFFORT_BUDGETS.get(thinking.effort)


def completion_room(engine, prompt_tokens: int, max_tokens: int | None) -> int:
    """max_tokens, checked against the context; when not given, all the room the context leaves."""
    ctx = engine.max_context
    if prompt_tokens >= ctx or (max_tokens is not None and prompt_tokens + max_tokens > ctx):
        raise context_exceeded(ctx, prompt_tokens, max_tokens)
    return max_tokens if max_tokens is not None else ctx - prompt_tokens


def tool_processors(tok, tools, choice: ToolChoice) -> list:
    """tool_choice none: the tools stay in the prompt and the tool-call token is banned."""
    call_open = tok.token_to_id("<tool_call>")
    return [BanTokens([call_open])] if tools and choice.mode == "none" and call_open is not None else []

"""Request bodies of the OpenAI routes, as /openapi.json documents them. Fields not named here are
kept as extras: those whose meaning the server cannot honour (audio, web_search_options, ...) are
refused with a 400 (engine/server/bridge/checks.py), the rest (user, store, metadata, service_tier, ...)
are ignored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.server.bridge.checks import MAX_SAMPLES

Temperature = Field(default=None, ge=0, le=2)
Penalty = Field(default=None, ge=-2, le=2)


class ContentPart(BaseModel):
    type: str
    text: str | None = None
    image_url: Any = None


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict = "{}"        # a JSON string, as OpenAI sends it (an object is accepted too)


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]   # function: legacy tool result
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None    # legacy: the assistant's one call
    tool_call_id: str | None = None
    reasoning_content: str | None = None   # earlier thinking sent back (either name)
    reasoning: str | None = None


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[^\s<>]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Shared by chat and plain completions (top_k, min_p, repetition_penalty, ignore_eos and
    stop_token_ids are extensions, spelt as vLLM spells them)."""
    model: str
    temperature: float | None = Temperature
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=2 ** 31 - 1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Penalty
    frequency_penalty: float | None = Penalty
    repetition_penalty: float | None = Field(default=None, gt=0, le=10)
    seed: int | None = Field(default=None, ge=-(2 ** 63), lt=2 ** 64)     # taken modulo 2**63
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1, le=MAX_SAMPLES)    # samples of each prompt
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    functions: list[FunctionDefinition] | None = None                 # legacy tools
    function_call: Literal["none", "auto"] | FunctionName | None = None  # legacy tool_choice
    parallel_tool_calls: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    thinking_token_budget: int | None = Field(default=None, ge=0)
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None     # engine/server/bridge/structured.py


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="allow")
    prompt: str | list[int] | list[str | list[int]]     # one prompt, or a batch of them
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    response_format: dict[str, Any] | None = None     # engine/server/bridge/structured.py

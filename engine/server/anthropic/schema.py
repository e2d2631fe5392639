"""Request bodies of the Anthropic routes (Messages API), as /openapi.json documents them. Fields not
named here are kept as extras: those the server cannot honour (mcp_servers, container, ...) are
refused with a 400 (engine/server/bridge/checks.py), the rest (metadata, cache_control, service_tier, ...)
are ignored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Block(BaseModel):
    """One content block; which fields matter depends on `type`."""
    type: str
    text: str | None = None                    # text
    source: dict[str, Any] | None = None       # image, document
    id: str | None = None                      # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None             # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None                # thinking
    signature: str | None = None


class Message(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[^\s<>]+$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None                    # "custom" or absent; server tools are refused


class ToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: Literal["summarized", "omitted"] | None = None


class OutputConfig(BaseModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: dict[str, Any] | None = None


class CountTokensRequest(BaseModel):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: dict[str, Any] | None = None     # the structured-outputs beta's name for output_config.format


class MessagesRequest(CountTokensRequest):
    model_config = ConfigDict(extra="allow")
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=2 ** 31 - 1)

"""Request body of POST /v1/responses.

The fields the server honours are declared; any other field is kept (`extra="allow"`) only so that
convert.py can refuse it by name: the Responses API has many (background, conversation,
prompt, ...), and none of them is ignored in silence. Input items and tools are checked item by item
in convert.py, where an error can name `input.3.call_id`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.server.openai.schema import FunctionDefinition, Temperature

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ReasoningConfig(BaseModel):
    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None    # the older name of `summary`


class TextConfig(BaseModel):
    format: dict[str, Any] | None = None            # {"type": "text" | "json_object" | "json_schema", ...}
    verbosity: Literal["medium"] | None = None      # the model has no verbosity knob: only the default


class StreamOptions(BaseModel):
    include_obfuscation: bool | None = None         # padding against network side channels: none here


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Temperature
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool | None = True
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None             # a routing hint; the prefix cache needs none
    prompt_cache_retention: Literal["in_memory"] | None = None
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    background: bool | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)   # bounds built-in tool calls: there are none


# ---- input items and tools (checked one by one in convert.py) -------------------------------
class Item(BaseModel):
    model_config = ConfigDict(extra="allow")       # id, status, phase, annotations: descriptive only


class MessageItem(Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class FunctionCallItem(Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Item):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


class ReasoningItem(Item):
    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = []
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None


class FunctionTool(FunctionDefinition):
    """The Responses API's function tool: the chat API's definition, flat ({type, name, ...})."""
    type: Literal["function"]

"""The engine's public API: what the desktop app imports (besides engine.server for the endpoint)."""

from engine.chat.tools import ToolCallParser, call_arguments, tool_schemas
from engine.engine import Engine
from engine.memory import MemoryPlan, plan_for
from engine.params import (CallArgs, CallStart, ContextLengthError, EngineConfig, GenerateOutput, QueueFullError,
                           Reasoning, SamplingParams, StreamEvent, Text, Timings, TokenLogprob, ToolCall, Usage,
                           add_calls)
from engine.streaming import starts_in_reasoning

__all__ = ["CallArgs", "CallStart", "ContextLengthError", "Engine", "EngineConfig", "GenerateOutput", "MemoryPlan",
           "QueueFullError", "Reasoning", "SamplingParams", "StreamEvent", "Text", "Timings", "TokenLogprob",
           "ToolCall", "ToolCallParser", "Usage", "add_calls", "call_arguments", "plan_for", "starts_in_reasoning",
           "tool_schemas"]

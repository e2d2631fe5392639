"""The engine's public surface: everything the desktop app and the HTTP server use, and nothing else.

app/ imports the engine only from here; engine/server/ takes what it needs of the engine from here too.
"""

from engine.chat.tools import ToolCallParser, call_arguments, tool_schemas
from engine.config import ModelConfig, UnsupportedModelError, load_model_config, parse_model_config
from engine.device import DeviceInfo, probe
from engine.engine import Engine, RequestHandle
from engine.memory import MemoryPlan, plan_for
from engine.params import (DTYPE_NAMES, KV_DTYPES, MAX_DRAFTS, PROFILES, WEIGHTS, CallArgs, CallStart,
                           ContextLengthError, EngineConfig, GenerateOutput, QueueFullError, Reasoning, SamplingParams,
                           SpeculationStats, StreamEvent, Text, Timings, TokenLogprob, ToolCall, Usage, add_calls)
from engine.streaming import starts_in_reasoning


def serve(engine: Engine, model_id: str, host: str, port: int, api_key: str | None = None):
    """Start the OpenAI- and Anthropic-compatible endpoint around a loaded engine on its own thread; returns the
    running server (`.port` is the port it listens on, `.stop()` ends it). FastAPI is imported only here, so a
    build without it can still run the engine (ImportError says so)."""
    from engine.server import ServerSettings, ServerThread, create_app
    app = create_app(ServerSettings(model_id=model_id, host=host, port=port, api_key=api_key), engine)
    return ServerThread(app, host, port).start()


__all__ = ["DTYPE_NAMES", "KV_DTYPES", "MAX_DRAFTS", "PROFILES", "WEIGHTS", "CallArgs", "CallStart",
           "ContextLengthError", "DeviceInfo", "Engine", "EngineConfig", "GenerateOutput", "MemoryPlan",
           "ModelConfig", "QueueFullError", "Reasoning", "RequestHandle", "SamplingParams", "SpeculationStats",
           "StreamEvent", "Text", "Timings", "TokenLogprob", "ToolCall", "ToolCallParser", "UnsupportedModelError",
           "Usage", "add_calls", "call_arguments", "load_model_config", "parse_model_config", "plan_for", "probe",
           "serve", "starts_in_reasoning", "tool_schemas"]

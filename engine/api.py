"""The engine's public API: the only module the desktop app imports."""

from engine.engine import Engine
from engine.params import (ContextLengthError, EngineConfig, GenerateOutput, QueueFullError, SamplingParams, StreamEvent,
                           Timings, TokenLogprob, Usage)

__all__ = ["ContextLengthError", "Engine", "EngineConfig", "GenerateOutput", "QueueFullError", "SamplingParams",
           "StreamEvent", "Timings", "TokenLogprob", "Usage"]

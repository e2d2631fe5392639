"""The engine's public API: what the desktop app imports (besides engine.server for the endpoint)."""

from engine.engine import Engine
from engine.memory import MemoryPlan, plan_for
from engine.params import (ContextLengthError, EngineConfig, GenerateOutput, QueueFullError, SamplingParams,
                           StreamEvent, Timings, TokenLogprob, Usage)

__all__ = ["ContextLengthError", "Engine", "EngineConfig", "GenerateOutput", "MemoryPlan", "QueueFullError",
           "SamplingParams", "StreamEvent", "Timings", "TokenLogprob", "Usage", "plan_for"]

"""The engine's public surface: everything the desktop app and the HTTP server use, and nothing else.

app/ imports the engine only from here (and the endpoint from engine.server); engine/server/ takes what it needs of
the engine from here too.
"""

from engine.chat.tool_values import call_arguments
from engine.chat.tools import ToolCallParser, tool_schemas
from engine.model.config import ModelConfig, UnsupportedModelError, load_model_config, parse_model_config
from engine.core.collector import freeze_long_lived
from engine.core.device import DeviceInfo, probe
from engine.core.engine import NO_VISION, Engine, LoadCancelled, RequestHandle
from engine.listen import DEFAULT_PORT, PortInUseError, listen_socket
from engine.core.memory import MemoryPlan, budget_for, plan_for, system_share
from engine.model.drafter_config import check_drafter_folder
from engine.core.params import (DTYPE_NAMES, KV_DTYPES, MAX_DRAFTS, PROFILES, SPECULATION, VISION, WEIGHTS, CallArgs,
                           CallStart,
                           Constraint, ContextLengthError, EngineConfig, FinishReason, GenerateOutput, Piece,
                           QueueFullError, Reasoning,
                           SamplingParams, SpeculationStats, StreamEvent, Text, Timings, TokenLogprob, ToolCall, Usage,
                           add_calls)
from engine.text.output_stream import starts_in_reasoning
from engine.vision.processor import ImageInputError, decode_image
from engine.vision.prompt import split_images
from engine.weights.checkpoint import CheckpointError, check_checkpoint
from engine.weights.formats import detect_format, with_side_quant_config


__all__ = ["DEFAULT_PORT", "DTYPE_NAMES", "KV_DTYPES", "MAX_DRAFTS", "NO_VISION", "PROFILES", "SPECULATION", "VISION",
           "WEIGHTS", "check_drafter_folder",
           "CallArgs", "CallStart", "CheckpointError", "Constraint", "ContextLengthError", "DeviceInfo", "Engine",
           "EngineConfig", "FinishReason", "GenerateOutput", "ImageInputError", "LoadCancelled", "MemoryPlan",
           "ModelConfig", "Piece", "PortInUseError", "QueueFullError", "Reasoning", "RequestHandle", "SamplingParams",
           "SpeculationStats",
           "StreamEvent", "Text", "Timings", "TokenLogprob", "ToolCall", "ToolCallParser", "UnsupportedModelError",
           "Usage", "add_calls", "budget_for", "call_arguments", "check_checkpoint", "decode_image", "detect_format",
           "freeze_long_lived", "listen_socket", "load_model_config", "parse_model_config", "plan_for", "probe",
           "split_images", "starts_in_reasoning", "system_share", "tool_schemas", "with_side_quant_config"]

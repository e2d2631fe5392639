"""Plain data classes of the public API: engine settings, sampling parameters, results."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from engine.cache.kv_format import KVFormat

PROFILES = {"C1": 1, "C2": 2, "C4": 4, "C8": 8}
MAX_DRAFTS = 5                      # with the MTP head (one MTP step a draft: more rarely pays)
MAX_BLOCK_DRAFTS = 15               # with a block drafter (one forward drafts them all; k + 1 verify rows must fit the
#                                     decode kernels: model/batch.py MAX_DECODE_LEN)
DEVICES = ("auto", "cuda", "cpu")                       # "cuda:N" picks one GPU of several
DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32")
KV_DTYPES = (*(kv.value for kv in KVFormat), "auto")   # kv_dtype's names: the formats, most precise first, and auto
WEIGHTS = ("auto", "bf16", "int4")
SPECULATION = ("auto", "mtp", "dflash", "off")     # auto: the block drafter when one is given, else the MTP head
VISION = ("auto", "resident", "on_demand", "off")   # where the vision tower lives (core/memory.py vision_placement)


@dataclass
class EngineConfig:
    model: str                      # checkpoint directory
    device: str = "auto"            # auto | cuda | cpu
    dtype: str = "auto"             # auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32
    weights: str = "auto"           # auto (16-bit if it fits, else int4) | bf16 (the dtype) | int4
    quant_group: int = 128          # int4 / int8 group size along K
    quant_method: str = "als"       # int4 quantizer for 16-bit / FP8 sources: als (optimised) | rtn
    gpu_memory_gb: float | None = None  # cap on the memory the engine plans with (simulates a smaller card)
    profile: str = "C1"             # concurrency: C1 | C2 | C4 | C8 sequences decoding together
    kv_dtype: str = "bf16"          # a KVFormat: bf16 (activation dtype) | int8 | k8v4 / k4v4 (8- / 4-bit K, 4-bit V)
    #                                 | auto (the most precise that reaches max_context, or the model's limit)
    max_context: int | None = None  # tokens per sequence; None: the model's limit, capped by memory
    prefill_chunk: int = 2048       # prompt tokens per prefill step (long prompts are split)
    max_queue: int = 64             # requests waiting beyond the profile before submit() refuses
    page_size: int = 64             # tokens per KV page
    snapshots: int | None = None    # GDN state snapshots kept for prefix reuse (None: from memory)
    cuda_graphs: bool = True        # capture decode in CUDA graphs (CUDA only)
    speculation: str = "auto"       # auto | mtp (the checkpoint's MTP head) | dflash (the block drafter) | off
    drafter: str | None = None      # a DFlash / DFlash2 drafter checkpoint folder for this model (model/dflash.py)
    speculative_tokens: int | None = None  # most drafts per round (0 off; up to 5 with MTP, 15 with a block drafter);
    #                                        None on a GPU: 3 with MTP, the block drafter's block - 1; on the CPU: 0
    draft_vocab: int = 32768        # draft head rows: Qwen's ids are in merge order, so the first ones are the most
    #                                 frequent tokens (verify uses the full head)
    vision: str = "auto"            # the vision tower: auto (on demand on cards <= 24 GiB, else resident) | resident
    #                                 (on the GPU always) | on_demand (host memory; on the GPU only while
    #                                 encoding) | off
    max_images: int = 16            # images per request
    max_image_bytes: int = 20 << 20  # encoded bytes of one image (the file as sent)
    host_cache_gb: float | None = None  # host-RAM tier for KV pages / snapshots evicted from the GPU; None:
                                        # min(8 GiB, 25% of RAM); 0: off
    disk_cache: bool = False        # write each finished request's KV pages and snapshots to disk (read after restarts)
    disk_cache_gb: float = 20.0     # the disk tier's bound (least recently used files go first)
    disk_cache_dir: str | None = None   # None: QWENDESK_CACHE_DIR/kv, else the user cache folder's qwendesk/kv

    def policy(self, weights: str | None = None):
        """The quantization policy for `weights` (default: this config's); None for 16-bit weights."""
        from engine.weights.policy import QuantPolicy
        weights = weights or self.weights
        one_of("weights", weights, WEIGHTS)
        return QuantPolicy(group_size=self.quant_group, method=self.quant_method) if weights == "int4" else None

    def method(self, has_mtp: bool, has_drafter: bool) -> str:
        """How to draft (the one rule): "dflash" when a block drafter is at hand (the planner: this config names one;
        the engine: one was loaded, or attached to a model given to Engine.from_model), else "mtp" when the checkpoint
        has its MTP head, else "off"; `speculation` may ask for one of them ("auto": the first that is there)."""
        one_of("speculation", self.speculation, SPECULATION)
        if self.speculation == "dflash" and not has_drafter:
            raise ValueError("speculation 'dflash' needs a drafter (EngineConfig.drafter: the drafter's folder)")
        if self.speculation in ("auto", "dflash") and has_drafter:
            return "dflash"
        return "mtp" if self.speculation in ("auto", "mtp") and has_mtp else "off"

    def drafts(self, on_gpu: bool, method: str = "mtp", block: int | None = None) -> int:
        """Most drafts per speculative round on this device with `method` (0: no speculation, no MTP module and no
        drafter loaded); block: a block drafter's rows (it drafts at most block - 1)."""
        most = MAX_BLOCK_DRAFTS if method == "dflash" else MAX_DRAFTS
        default = (most if method == "dflash" else 3) if on_gpu else 0
        k = default if self.speculative_tokens is None else self.speculative_tokens
        if not 0 <= k <= most:
            raise ValueError(f"speculative_tokens must be between 0 and {most}"
                             f"{' with a block drafter' if method == 'dflash' else ''}, not {k}")
        if method == "dflash" and block:
            k = min(k, block - 1)
        return 0 if method == "off" else k

    def validate(self, has_drafter: bool | None = None) -> None:
        """Refuse settings no engine can run with (a one-line ValueError), before anything loads. has_drafter: a
        block drafter comes with the model (Engine.from_model's; default: whether config.drafter names one)."""
        if self.device not in DEVICES and not re.fullmatch(r"cuda:\d+", self.device):
            raise ValueError(f"device must be {', '.join(DEVICES)} or cuda:N, not {self.device!r}")
        one_of("dtype", self.dtype, DTYPE_NAMES)
        one_of("kv_dtype", self.kv_dtype, KV_DTYPES)
        one_of("weights", self.weights, WEIGHTS)
        one_of("profile", self.profile, PROFILES)
        one_of("vision", self.vision, VISION)
        if self.max_images < 0 or self.max_image_bytes < 1:
            raise ValueError("max_images must be >= 0 and max_image_bytes >= 1")
        has_drafter = bool(self.drafter) if has_drafter is None else has_drafter
        self.drafts(on_gpu=False, method=self.method(has_mtp=True, has_drafter=has_drafter))
        if self.max_context is not None and self.max_context < 1:
            raise ValueError(f"max_context must be at least 1 token, not {self.max_context}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, not {self.max_queue}")
        if self.host_cache_gb is not None and not self.host_cache_gb >= 0:
            raise ValueError(f"host_cache_gb must be >= 0 (0: no host tier), not {self.host_cache_gb}")
        if not self.disk_cache_gb > 0:
            raise ValueError(f"disk_cache_gb must be > 0, not {self.disk_cache_gb}")
        if self.disk_cache and self.host_cache_gb == 0:
            raise ValueError("disk_cache reads through the host tier: it needs host_cache_gb > 0")

    @property
    def max_running(self) -> int:
        one_of("profile", self.profile, PROFILES)
        return PROFILES[self.profile]


def one_of(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


@dataclass
class Constraint:
    """What a reply must be, enforced while decoding (engine/text/grammar.py: a token mask at every step). The reasoning
    stays free: the constraint starts after </think>.
    - json_schema: the reply is one JSON value matching it ({"type": "object"}: any JSON object). A keyword the
      grammar cannot enforce is an error, never ignored.
    - tools (OpenAI-style): tool calls in the model's own syntax, arguments matching each tool's parameters schema.
      tool_mode "required": the reply is one or more calls (only to `tool_name` when set: then one call); "auto": the
      model may answer in text (or, with json_schema too, in JSON), and once it opens a call the call is constrained.
      parallel False: at most one call."""
    json_schema: dict | None = None
    tools: list[dict] | None = None
    tool_mode: str = "auto"         # auto | required
    tool_name: str | None = None
    parallel: bool = True

    def validate(self) -> None:
        if self.json_schema is None and not self.tools:
            raise ValueError("a constraint needs a json_schema or tools")
        one_of("tool_mode", self.tool_mode, ("auto", "required"))
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ValueError("json_schema must be a JSON object")


# every generated token is searched for each stop string, and text that may still become one is held back: bounded,
# so that one request cannot slow every other's steps or hold its whole reply back
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 512


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0        # 0: greedy
    top_p: float = 1.0
    top_k: int = 0                  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None     # top-n logprobs per generated token (0: only the chosen token's)
    skip_special_tokens: bool = True
    thinking_budget: int | None = None  # reasoning tokens after which </think> is forced
    # callables (output token ids so far, fp32 logits [V]) -> logits, applied before sampling
    logits_processors: list = field(default_factory=list)
    constraint: Constraint | None = None  # what the reply must be (grammar-constrained decoding)

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.top_k < 1 << 31:
            raise ValueError("top_k must be >= 0 (0 disables it) and below 2**31")
        if self.seed is not None and not -(1 << 63) <= self.seed < 1 << 63:
            raise ValueError("seed must fit in 64 bits")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError("logprobs must be between 0 and 20")
        if self.thinking_budget is not None and self.thinking_budget < 0:
            raise ValueError("thinking_budget must be >= 0")
        if len(self.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters")
        if len(self.stop_token_ids) > MAX_STOP_STRINGS:
            raise ValueError(f"stop_token_ids takes at most {MAX_STOP_STRINGS} ids")
        if self.constraint is not None:
            self.constraint.validate()


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float | None           # None: a scored prompt's first token (nothing before it to predict it)
    top: list[tuple[int, float]]    # (token id, logprob), most likely first


@dataclass
class SpeculationStats:
    """What speculative decoding did for one request (or the engine): rounds, drafts proposed and kept, and per
    draft position how many rounds made it and kept it (rounds make 1 .. k drafts, as the engine finds pays)."""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    method: str = ""                 # how the drafts were made: mtp | dflash
    accepted_at: list[int] = field(default_factory=list)     # [j]: rounds whose draft j + 1 was kept
    drafted_at: list[int] = field(default_factory=list)      # [j]: rounds that made a draft j + 1

    def add(self, k: int, kept: int) -> None:
        self.rounds += 1
        self.drafted += k
        self.accepted += kept
        grow = [0] * (k - len(self.accepted_at))
        self.accepted_at += grow
        self.drafted_at += grow
        for j in range(k):
            self.drafted_at[j] += 1
            self.accepted_at[j] += j < kept

    @property
    def tokens_per_round(self) -> float:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def position_rates(self) -> list[float]:
        """Per draft position, the share of the rounds that made it that kept it."""
        return [kept / made for kept, made in zip(self.accepted_at, self.drafted_at)]


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0          # prompt tokens reused from the prefix cache
    reasoning_tokens: int = 0       # completion tokens spent thinking
    speculation: SpeculationStats | None = None   # when the request decoded with drafts (MTP or a block drafter)


@dataclass
class Timings:
    queue_ms: float = 0.0           # submitted -> admitted
    ttft_ms: float = 0.0            # submitted -> first token
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    total_ms: float = 0.0


# ---- what a request's stream carries ---------------------------------------------------------
# A reply arrives as pieces, in the order the model wrote them: Text (content), Reasoning (the thinking),
# and, when the request has tools, CallStart / CallArgs (engine/chat/tools.py parses the calls out of
# the content).


@dataclass
class Text:
    """Content: the reply the user reads."""
    text: str


@dataclass
class Reasoning:
    """The model's thinking (inside <think> ... </think>)."""
    text: str


@dataclass
class CallStart:
    """A tool call begins: its index in the reply (0, 1, ...) and its function's name."""
    index: int
    name: str


@dataclass
class CallArgs:
    """A piece of call `index`'s arguments: the pieces of a call joined are one JSON object."""
    index: int
    text: str


@dataclass
class ToolCall:
    """A whole call: the function's name and its arguments as a JSON object's text."""
    name: str
    arguments: str = ""


Piece = Text | Reasoning | CallStart | CallArgs


def add_calls(calls: list[ToolCall], pieces: list[Piece]) -> None:
    """Grow `calls` by the CallStart / CallArgs among a stream's pieces."""
    for piece in pieces:
        if isinstance(piece, CallStart):
            calls.append(ToolCall(piece.name))
        elif isinstance(piece, CallArgs):
            calls[piece.index].arguments += piece.text

EventKind = Literal["delta", "finish"]
TokenKind = Literal["content", "reasoning", "control"]
FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "error"]


@dataclass
class StreamEvent:
    """One item of a request's stream. kind: "delta" (new pieces / tokens) or "finish" (the last event:
    what was held back until the end, finish_reason, usage, timings; error text when finish_reason is "error").
    token_kinds: one per token id: content | reasoning | control (<think>, </think>, the blank line after it,
    a stop token or end of sequence); a tool call's tokens are content.
    finish_reason: stop (end of sequence, a stop token or a stop string) | length | tool_calls (it stopped
    and the reply made calls) | cancelled | error.
    stop_sequence: the stop string that ended the reply (None when anything else did)."""
    kind: EventKind
    pieces: list[Piece] = field(default_factory=list)   # in order
    token_ids: list[int] = field(default_factory=list)
    token_kinds: list[TokenKind] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    error: str | None = None

    @property
    def text(self) -> str:
        """This event's content."""
        return "".join(p.text for p in self.pieces if isinstance(p, Text))

    @property
    def reasoning(self) -> str:
        return "".join(p.text for p in self.pieces if isinstance(p, Reasoning))


class QueueFullError(RuntimeError):
    """The engine's waiting queue is full; try again later (HTTP 429 / 529)."""


class ContextLengthError(ValueError):
    """The prompt does not fit the context."""


@dataclass
class GenerateOutput:
    token_ids: list[int]
    text: str                       # content (reasoning and tool calls excluded)
    finish_reason: FinishReason     # stop | length | tool_calls | cancelled
    prompt_tokens: int
    reasoning: str = ""             # the model's thinking, when the prompt turned it on
    tool_calls: list[ToolCall] = field(default_factory=list)   # when the request had tools
    stop_sequence: str | None = None
    logprobs: list[TokenLogprob] | None = None
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)

"""Sequence: one request's tokens, what it holds in the cache, and its output stream."""

from __future__ import annotations

import queue
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Callable

from engine.cache.pages import PageTable
from engine.core.params import FinishReason, SamplingParams, SpeculationStats, StreamEvent, TokenLogprob
from engine.vision.prompt import ImagePrompt

if TYPE_CHECKING:
    from engine.text.grammar import Matcher
    from engine.text.output_stream import OutputStream


@dataclass
class Sequence:
    id: int
    prompt: list[int]
    params: SamplingParams
    seed: int                                   # the request's seed, or one drawn for it
    max_total: int = 0                          # prompt + new tokens it may reach (capped by the context)
    output: list[int] = field(default_factory=list)
    pages: PageTable = field(default_factory=PageTable)
    hashes: list[bytes] = field(default_factory=list)   # chained hash of each full computed page
    state_slot: int = -1
    num_computed: int = 0                       # tokens whose KV and GDN state are in the cache
    cached_tokens: int = 0                      # prompt tokens taken from the prefix cache
    snapshot_at: int = -1                       # prompt boundary to snapshot the GDN state at
    disk_wait: int = -1                         # CacheManager.reads_done when its lookup said loading (scheduler)
    rolling_slot: int = -1                      # end-of-turn snapshot: state at the latest page boundary
    spec_counts: SpeculationStats = field(default_factory=SpeculationStats)   # what speculation did for it
    spec_snapshot: tuple[int, int] | None = None  # a round's snapshot (page boundary, slot) not yet reached
    finish_reason: FinishReason | None = None
    error: str | None = None                    # why this request must end with an error (set while sampling)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    forced: deque = field(default_factory=deque)  # tokens to emit next instead of sampling
    events: queue.Queue = field(default_factory=queue.Queue)   # StreamEvents for the consumer
    on_event: Callable[[StreamEvent], None] | None = None       # told after each one is queued (engine thread)
    stream: OutputStream | None = None          # its text, set at submit
    matcher: Matcher | None = None              # a constrained request's grammar state
    images: ImagePrompt | None = None           # the prompt's images (None: text only)
    image_embeds: dict = field(default_factory=dict)  # image index -> its rows' embeddings, until they are computed
    t_submit: float = field(default_factory=time.perf_counter)
    t_admit: float = 0.0
    t_first: float = 0.0
    tokens: list[int] = field(init=False)       # prompt + output, appended to (never rebuilt: host work per step
    hash_tokens: list[int] = field(init=False)  # must not grow with the context); what the prefix cache hashes:
    #                                             the tokens, each image's run standing for its digest

    def __post_init__(self):
        self.tokens = self.prompt + self.output
        self.hash_tokens = self.images.hash_tokens + self.output if self.images else self.tokens

    def append(self, token: int) -> None:
        """A new output token (the only way output grows: the token lists above follow it)."""
        self.output.append(token)
        self.tokens.append(token)
        if self.hash_tokens is not self.tokens:
            self.hash_tokens.append(token)

    @property
    def position_delta(self) -> int:
        """Rotary position of token i past the prompt: i + this (0 for text; below 0 after images)."""
        return self.images.mrope.delta if self.images else 0

    def pending_images(self, start: int, end: int) -> list[int]:
        """Images with rows in tokens start .. end - 1 whose embeddings are not at hand."""
        if not self.images:
            return []
        return [k for k, (a, b) in enumerate(self.images.spans) if a < end and b > start and k not in self.image_embeds]

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def sampled_on_device(self) -> bool:
        """Its next token can be drawn without the host seeing the logits: no logits processors, penalties or
        logprobs, no forced token pending (a decode step in flight, a speculative round)."""
        p = self.params
        return not (p.logits_processors or p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0
                    or p.logprobs is not None or self.forced)

    @property
    def prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)

    def emit(self, event: StreamEvent) -> None:
        self.events.put(event)
        if self.on_event is not None:
            self.on_event(event)


def submitted(seq: Sequence) -> OutputStream:
    """A request's output stream: every request the output stage and speculation see was submitted with one
    (Engine.submit; a scoring pass has none)."""
    assert seq.stream is not None, f"request {seq.id} has no output stream"
    return seq.stream

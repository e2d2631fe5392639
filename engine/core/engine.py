"""Engine: loads a checkpoint and serves requests from one background loop thread (engine/core/loop.py).

Other threads talk to the loop only through its inbox: submit() posts a request and returns a handle whose events
arrive on the request's own queue; cancel(), warm() and score() travel the same way. Building is engine/core/build.py,
prompts engine/core/prompts.py, what happens to each new token engine/core/output.py.
"""

from __future__ import annotations

import queue
import random
import threading
from concurrent.futures import Future

import torch

from engine.core import build
from engine.core.collector import freeze_long_lived, release_frozen
from engine.core.device import empty_host_cache, on_gpu, resolve_device, resolve_dtype
from engine.core.loop import EngineLoop
from engine.core.memory import MemoryPlan, model_drafts
from engine.core.messages import Cancel, Score, SetDraftOracle, Submit, Warm
from engine.core.params import (ContextLengthError, EngineConfig, GenerateOutput, Piece, Reasoning, SamplingParams,
                                StreamEvent, Text, TokenLogprob, ToolCall, add_calls)
from engine.core.prompts import NO_VISION, Prompts
from engine.core.sequence import Sequence
from engine.vision.processor import ProcessedImage
from qwendesk_kernels.gdn import RECURRENT_MAX_TOKENS

__all__ = ["NO_VISION", "Engine", "LoadCancelled", "RequestHandle"]


class RequestHandle:
    """Iterate to receive a request's StreamEvents; the last one has kind "finish"."""

    def __init__(self, engine: Engine, seq: Sequence):
        self.id = seq.id
        self.prompt_tokens = len(seq.prompt)
        self._engine = engine
        self._events = seq.events

    def __iter__(self):
        while True:
            event = self._events.get()
            yield event
            if event.kind == "finish":
                return

    def ready(self) -> list[StreamEvent]:
        """The events queued so far, without waiting (with `on_event`: read them when told)."""
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def cancel(self) -> None:
        self._engine.cancel(self.id)


class LoadCancelled(Exception):
    """Engine(cancel=event) stopped loading because the event was set; nothing of it stays in memory."""


class Engine:
    def __init__(self, config: EngineConfig, progress=None, cancel: threading.Event | None = None,
                 freeze_gc: bool = True, _parts=None):
        """progress(stage, done, total): what loading is doing (weights, int4 conversion, CUDA graphs,
        warm-up), for a progress bar. cancel: set it from any thread to stop loading at the next step
        reported (a weight, a kernel tuned, a warm-up prompt); the constructor then raises LoadCancelled.
        freeze_gc: the load ends with a full garbage collection in this thread, and what survives is kept out of
        later ones (engine/core/collector.py), until close(); off where the program manages the collector itself
        (the desktop app, on its GUI thread). _parts: from_model's."""
        report = progress or (lambda stage, done, total: None)

        def step(stage: str, done: int, total: int) -> None:
            if cancel is not None and cancel.is_set():
                raise LoadCancelled(f"loading {config.model} was cancelled")
            report(stage, done, total)

        self._progress = step
        config.validate(has_drafter=bool(config.drafter) or (_parts is not None and _parts[0].drafter is not None))
        self.config = config
        self.device = resolve_device(config.device)
        self._dtype = resolve_dtype(config.dtype, self.device.type)
        loaded = (build.load(config, self.device, self._dtype, step) if _parts is None
                  else build.wrap(config, self.device, *_parts))
        self.model_config, self.tokenizer, self.template = loaded.model_config, loaded.tokenizer, loaded.template
        self.weights, self._model, self._encoder = loaded.weights, loaded.model, loaded.encoder
        self.drafts = model_drafts(config, on_gpu(self.device), has_mtp=self._model.mtp is not None,
                                   drafter=self._model.drafter.cfg if self._model.drafter is not None else None)
        self._plan = build.plan(config, loaded, self.device, self._dtype, self.drafts)
        self.max_context = self._plan.max_context
        parts = build.assemble(config, loaded, self._plan, self.device, self._dtype, self.drafts, step)
        self._pools, self._cache, self._disk, self._scheduler = parts.pools, parts.cache, parts.disk, parts.scheduler
        self._runner, self._spec, self._grammars = parts.runner, parts.spec, parts.grammars
        self._prompts = Prompts(config, self.model_config, self.tokenizer, self.template, loaded.image_config,
                                accepts_images=self._encoder is not None)
        self._loop = EngineLoop(config, self.tokenizer, self._grammars, self._scheduler, self._cache, self._runner,
                                self._spec, self._encoder)
        self._closed, self._froze_gc = False, False
        if on_gpu(self.device):
            self._warm_up_linears()
        if self._spec is not None:          # every round the engine can run, captured now: never on a request's path
            self._spec.capture(lambda done, total: step("Capturing speculative rounds", done, total))
        if self._cache.host is not None:    # its pinned slabs, allocated beside the steps above: never while serving
            step("Reserving host memory for the cache", 0, 1)
            self._cache.host.wait_allocated()
        self._loop.start()
        if on_gpu(self.device):
            try:
                self._warm_up()
            except LoadCancelled:
                self.close()
                raise
        self._cache.disk = self._disk          # after the warm-up: its prompts are not worth a disk write
        if freeze_gc:
            freeze_long_lived()
            self._froze_gc = True

    def _warm_up_linears(self) -> None:
        """Each quantized weight shape and MoE layer kind run once (build.warm_up_linears), before the loop starts."""
        build.warm_up_linears(self._model, self._dtype, self.device, self.config.prefill_chunk, self._progress)

    def _warm_up(self) -> None:
        """Run the prefill shapes once so that the first user request does not pay for Triton compiling and
        tuning kernels: a full chunk; a prompt a little past RECURRENT_MAX_TOKENS (fla's chunked kernels tune per
        4,096 tokens of a step; its last 24 tokens are a step of their own); an odd length; and a short prompt whose
        step saves the GDN state in passing (a snapshot a page in: what most chat prompts do, a kernel variant of its
        own). What they cache is dropped."""
        page = self._cache.page_size
        lengths = [min(n, self.max_context - 2) for n in (self.config.prefill_chunk, RECURRENT_MAX_TOKENS + page + 24,
                                                          17, page + 33)]
        for i, length in enumerate(lengths):        # prompts with no prefix in common: each one prefills all
            self._progress("Warming up", i, len(lengths))
            self.generate([(7 * t + i) % self.model_config.vocab_size for t in range(length)],
                          SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))

    @classmethod
    def from_model(cls, config: EngineConfig, model, tokenizer, template=None, vision=None,
                   freeze_gc: bool = True) -> Engine:
        """An engine around an already built model (benchmarks with random weights). vision: (VisionTower, its
        ImageProcessorConfig, placement: resident | on_demand); the tower on the device when resident, else on the
        CPU."""
        return cls(config, freeze_gc=freeze_gc, _parts=(model, tokenizer, template, vision))

    # ---- public API (any thread) ---------------------------------------------------------
    def encode_prompt(self, prompt, tools=None, continue_final_message: bool = False, **template_kwargs) -> list[int]:
        """Token ids as given, or chat messages rendered with the checkpoint's template (with
        `continue_final_message`, the reply continues the last message, an assistant's cut-short reply,
        instead of starting a new one). Also how a caller counts a conversation's tokens."""
        return self._prompts.encode(prompt, tools, continue_final_message, **template_kwargs)

    @property
    def accepts_images(self) -> bool:
        """The loaded checkpoint has a vision tower and it is on (EngineConfig.vision)."""
        return self._encoder is not None

    def process_images(self, images: list[bytes]) -> list[ProcessedImage]:
        """Encoded image files -> the tower's inputs, within the engine's limits (EngineConfig.max_images,
        max_image_bytes); ImageInputError (a ValueError, one line) for anything it cannot take. Any thread."""
        return self._prompts.process_images(images)

    def expand_images(self, ids: list[int], images: list[ProcessedImage]) -> list[int]:
        """Token ids with one image placeholder per image (as the chat template writes them) -> the prompt the model
        reads: each placeholder repeated to its image's token count."""
        return self._prompts.expand_images(ids, images)

    def submit(self, prompt, params: SamplingParams | None = None, tools=None, images=None, on_event=None,
               **template_kwargs) -> RequestHandle:
        """Queue a request (token ids or chat messages); returns at once. `tools` (OpenAI-style): chat messages are
        rendered with them, and the reply's calls to them come out as CallStart / CallArgs pieces (token ids: the
        caller rendered them; give them for the parsing); `continue_final_message=True` continues the last message
        (encode_prompt). Chat messages may hold image parts {"type": "image", "image": <the image file's bytes>}.
        images: for token ids only, the ProcessedImages (process_images) of a prompt already expanded
        (expand_images). Raises ValueError for bad parameters (ImageInputError for images),
        ContextLengthError when the prompt does not fit, QueueFullError when busy."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        params = params or SamplingParams()
        params.validate()
        ids, image_info = self._prompts.render(prompt, tools, images, template_kwargs)
        if len(ids) >= self.max_context:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens; the context holds {self.max_context} "
                                     f"(prompt plus at least one new token)")
        stream, matcher = self._loop.output.open(ids, params, tools)
        seq_id = self._loop.take_id()
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(id=seq_id, prompt=ids, params=params, seed=seed,
                       max_total=min(len(ids) + params.max_tokens, self.max_context), images=image_info,
                       on_event=on_event, stream=stream, matcher=matcher)
        self._loop.output.start(seq)
        self._loop.post(Submit(seq))
        return RequestHandle(self, seq)

    def cancel(self, request_id: int) -> None:
        self._loop.post(Cancel(request_id))

    def set_draft_oracle(self, oracle, adaptive: bool = True) -> None:
        """Benchmarks and tests only: speculative drafts replaced per an engine.bench.oracle.DraftOracle (None: the
        MTP's own again); adaptive False: every step speculates, paying or not. Call while no request runs."""
        if self._spec is None:
            raise RuntimeError("this engine does not speculate (speculative_tokens 0, or no MTP module)")
        done: Future = Future()
        self._loop.post(SetDraftOracle(oracle, adaptive, done))
        done.result()

    def plan(self) -> MemoryPlan:
        """The memory plan the engine runs with (weights, KV, state, workspace, margin)."""
        return self._plan

    def stats(self) -> dict:
        stats = self._loop.stats()
        if self._disk is not None:          # its writer thread carries on while the loop idles: its figures now
            stats.update(self._disk.stats())
        if on_gpu(self.device):      # torch's allocator, now: held by tensors, and reserved from the driver
            stats["gpu_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            stats["gpu_reserved_bytes"] = torch.cuda.memory_reserved(self.device)
            stats["pinned_host_bytes"] = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
        return stats

    def generate(self, prompt, params: SamplingParams | None = None, tools=None, **template_kwargs) -> GenerateOutput:
        """Submit and wait for the whole result."""
        params = params or SamplingParams()
        handle = self.submit(prompt, params, tools=tools, **template_kwargs)
        pieces: list[Piece] = []
        calls: list[ToolCall] = []
        ids: list[int] = []
        logprobs: list[TokenLogprob] = []
        for ev in handle:
            pieces += ev.pieces
            add_calls(calls, ev.pieces)
            ids += ev.token_ids
            logprobs += ev.logprobs or []
            if ev.kind == "finish":
                if ev.finish_reason == "error":
                    raise RuntimeError(f"generation failed: {ev.error}")
                # (OutputStage.finish sends every finish event, with its reason, usage and timings)
                assert ev.finish_reason is not None and ev.usage is not None and ev.timings is not None
                return GenerateOutput(token_ids=ids, text="".join(p.text for p in pieces if isinstance(p, Text)),
                                      finish_reason=ev.finish_reason, prompt_tokens=handle.prompt_tokens,
                                      reasoning="".join(p.text for p in pieces if isinstance(p, Reasoning)),
                                      tool_calls=calls, stop_sequence=ev.stop_sequence,
                                      logprobs=logprobs if params.logprobs is not None else None,
                                      usage=ev.usage, timings=ev.timings)
        raise RuntimeError("the request ended without a finish event")

    def warm(self, prompt, tools=None, images=None, **template_kwargs) -> Future:
        """Ahead of a request (a conversation reopened after a restart): read what its prompt's prefix has in the
        disk tier into host memory, so that the request restores it by fast copies (the reads run beside the loop's
        steps). Returns once the prompt is rendered; the Future gives the prompt tokens a request would now reuse. The
        prompt as submit() takes it."""
        ids, image_info = self._prompts.render(prompt, tools, images, template_kwargs)
        done: Future = Future()
        self._loop.post(Warm(image_info.hash_tokens if image_info else ids, done))
        return done

    def score(self, token_ids) -> torch.Tensor:
        """Logits of every position of one sequence, [len, vocab] float32 on the CPU."""
        ids = self.encode_prompt(token_ids)
        if len(ids) > self.max_context:
            raise ContextLengthError(f"{len(ids)} tokens exceed the context of {self.max_context}")
        done: Future = Future()
        self._loop.post(Score(ids, done))
        return done.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.stop()
        if self._disk is not None:
            self._disk.close()                  # the writes queued so far are finished first
        # drop every reference to device memory (graphs, pools, cache), then give it back
        del self._runner, self._model, self._pools, self._cache, self._scheduler
        self._encoder = self._spec = None
        if self._froze_gc:
            release_frozen()
        if on_gpu(self.device):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            empty_host_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

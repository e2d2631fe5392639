"""Engine: loads a checkpoint and serves requests from one background loop thread.

Other threads talk to the loop only through queues: submit() puts a request in the inbox and
returns a handle whose events arrive on the request's own queue; cancel() and score() travel the
same way. Only the loop thread touches the model, the cache and the scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.cache_manager import CacheManager, PrefixHit
from engine.chat.template import ChatTemplate
from engine.config import load_model_config
from engine.disk_cache import DiskCache, default_root, namespace
from engine.host_cache import HostCache
from engine.kv_cache import CacheTensors
from engine.device import graphs_on, probe, resolve_device, resolve_dtype
from engine.grammar import Grammars
from engine.memory import MemoryPlan, budget_for, checkpoint_max_pixels, plan_for, plan_memory, vision_cost
from engine.model import load_model
from engine.model.linear import Embedding, Linear
from engine.model.moe import SparseMoE
from engine.params import (ContextLengthError, EngineConfig, GenerateOutput, QueueFullError, Reasoning,
                           SamplingParams, StreamEvent, Text, Timings, Usage, add_calls)
from engine.runner import ModelRunner, batch_buckets
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.speculation import Speculation
from engine.speculative import Speculator
from engine.streaming import OutputStream, starts_in_reasoning
from engine.tokenizer import Tokenizer
from engine.weights.convert_cache import source_identity
from engine.vision.encoder import Encoding, ImageEncoder
from engine.vision.processor import ImageInputError, ProcessedImage, load_processor_config, process_image
from engine.vision.prompt import image_prompt, split_images
from engine.vision.tokens import expand_image_placeholders
from engine.vision.tower import load_vision_tower
from qwendesk_kernels.gdn import RECURRENT_MAX_TOKENS
from qwendesk_kernels.moe_grouped import warm_up_tokens
from qwendesk_kernels.quant import WARM_UP_ROWS

log = logging.getLogger("qwendesk.engine")
NO_VISION = "the loaded model has no vision"
DISK_POLL_S = 0.002     # how often an otherwise idle loop looks whether the disk tier's reads are done

@dataclass
class StepInFlight:
    """A decode step whose sampled tokens are still on the device (Engine._decode). Their copy to the host is
    queued right behind the step, with an event: reading them later waits for this step only, where .tolist() on
    the device tensor would wait for everything queued since, the next step included."""
    seqs: list[Sequence]
    ids: torch.Tensor           # [N] int64, on the device
    host: torch.Tensor          # the same, arriving in page-locked host memory
    ready: object = None        # torch.cuda.Event recorded after the copy (None on the CPU)

    @classmethod
    def launch(cls, seqs: list[Sequence], ids: torch.Tensor) -> "StepInFlight":
        if not ids.is_cuda:
            return cls(seqs, ids, ids)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True).copy_(ids, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(seqs, ids, host, ready)

    def tokens(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


class RequestHandle:
    """Iterate to receive a request's StreamEvents; the last one has kind "finish"."""

    def __init__(self, engine: "Engine", seq: Sequence):
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
    def __init__(self, config: EngineConfig, progress=None, cancel: threading.Event | None = None, _parts=None):
        """progress(stage, done, total): what loading is doing (weights, int4 conversion, CUDA graphs,
        warm-up), for a progress bar. cancel: set it from any thread to stop loading at the next step
        reported (a weight, a kernel tuned, a warm-up prompt); the constructor then raises LoadCancelled.
        _parts: from_model's."""
        report = progress or (lambda stage, done, total: None)

        def step(stage: str, done: int, total: int) -> None:
            if cancel is not None and cancel.is_set():
                raise LoadCancelled(f"loading {config.model} was cancelled")
            report(stage, done, total)

        self._progress = step
        config.validate()
        self.config = config
        self.device = resolve_device(config.device)
        self._dtype = resolve_dtype(config.dtype, self.device.type)
        self._encoder: ImageEncoder | None = None
        self._encoding: tuple[Sequence, int, Encoding] | None = None   # the image being encoded (its sequence, index)
        self._image_config = None                   # the checkpoint's preprocessor_config.json, with vision
        if _parts is None:
            self.model_config = load_model_config(config.model)
            planned = plan_for(config, probe(config.device), model=self.model_config)   # decides weights="auto"
            if not planned.fits:
                raise MemoryError(planned.message)     # refused, with what would fit, before loading anything
            self.weights = planned.weights
            self.tokenizer = Tokenizer.from_checkpoint(config.model)
            self.template = ChatTemplate.from_checkpoint(config.model)
            placement = planned.vision
            self._model, vision_weights = load_model(config.model, self.device, self._dtype, mtp=planned.drafts > 0,
                                                     vision=placement != "off", policy=config.policy(self.weights),
                                                     progress=step)
            if placement != "off":                  # on demand: the tower is built in host memory
                tower = load_vision_tower(self.model_config.vision, vision_weights, self._dtype,
                                          self.device if placement == "resident" else "cpu",
                                          config.policy(self.weights))
                self._encoder = ImageEncoder(tower, self.device, placement)
                self._image_config = load_processor_config(config.model)
        else:
            self._model, self.tokenizer, self.template, *vision = _parts
            self.model_config = self._model.cfg
            self.weights = "int4" if any(getattr(m, "scheme", "") == "int4" for m in self._model.modules()) else "bf16"
            if vision and config.vision != "off":
                tower, self._image_config, placement = vision[0]
                self._encoder = ImageEncoder(tower, self.device, placement)
        # MTP drafts per round: the config's (3 by default on a GPU) when the checkpoint brought an MTP module
        self.drafts = config.drafts(self.device.type == "cuda") if self._model.mtp is not None else 0
        # the weights are in memory now: plan the cache from what is actually free
        held = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        vision = dataclasses.replace(vision_cost(self.model_config, config, self._dtype, probe(config.device),
                                                 self._image_config.max_pixels if self._image_config else
                                                 checkpoint_max_pixels(config.model)),
                                     placement=self._encoder.placement if self._encoder else "off")
        self._plan = plan_memory(self.model_config, config, self._dtype, weights_bytes=0,
                                 budget_bytes=budget_for(config, probe(config.device), held),
                                 drafts=self.drafts, on_gpu=self.device.type == "cuda",
                                 vision=dataclasses.replace(vision, weights_bytes=0) if vision.placement == "resident"
                                 else vision)     # a resident tower is in `held` already
        if not self._plan.fits:
            raise MemoryError(self._plan.message)
        self._plan.weights = self.weights
        self._plan.weights_bytes = sum(t.numel() * t.element_size() for t in [
            *self._model.parameters(), *self._model.buffers(),
            *(self._encoder.tower.parameters() if vision.placement == "resident" else ())])
        if vision.placement != "off":
            self._plan.vision_bytes = vision.weights_bytes + vision.encode_bytes
        self.max_context = self._plan.max_context
        self._pools = CacheTensors.allocate(self.model_config, self._plan.num_pages, config.page_size,
                                            self._plan.num_slots, self._dtype, self.device,
                                            mtp_layers=1 if self._model.mtp is not None else 0,
                                            kv_dtype=self._plan.kv_dtype)
        host = HostCache(self._pools, self._plan.host_cache_bytes) if self._plan.host_cache_bytes else None
        self._cache = CacheManager(self._pools, num_seq_slots=config.max_running, host=host)
        self._disk = DiskCache(config.disk_cache_dir or default_root(), namespace(self._cache_identity()),
                               int(config.disk_cache_gb * (1 << 30)),
                               self._plan.disk_staging_bytes) if config.disk_cache else None
        self._scheduler = Scheduler(self._cache, config.max_running, config.prefill_chunk,
                                    im_start_id=self.tokenizer.token_to_id("<|im_start|>"))
        # decode steps and speculative rounds replay CUDA graphs: on a GPU, unless switched off or an MoE layer's int8
        # experts run a torch loop that learns their token counts on the host (engine/model/moe.py)
        graphs = (config.cuda_graphs and graphs_on(self.device)
                  and all(m.graph_safe for m in self._model.modules() if isinstance(m, SparseMoE)))
        if graphs:
            self._progress("Capturing CUDA graphs", 0, 1)
        self._runner = ModelRunner(self._model, self._pools, self.device, max_batch=config.max_running,
                                   max_context=self.max_context, scratch_slot=self._cache.scratch_slot,
                                   cuda_graphs=graphs)
        self._spec: Speculation | None = None
        if self.drafts:
            speculator = Speculator(self._model, self._pools, self.drafts, config.max_running, self.max_context,
                                    config.draft_vocab)
            self._runner.speculator = speculator
            self._spec = Speculation(speculator, self._cache, batch_buckets(config.max_running), graphs=graphs,
                                     plain_times=self._runner.graphs.seconds if graphs else None)
        self._grammars = Grammars(self.tokenizer, self.model_config.vocab_size)
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._active = 0                       # submitted and not finished
        self._next_id = 0
        self._seqs: dict[int, Sequence] = {}   # loop thread only
        self._in_flight: StepInFlight | None = None   # loop thread only: see _decode
        self._warming: list[list] = []   # loop thread only: [ids, Future, reads_done at its last lookup] of warm()s
        self._stats = self._collect_stats()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="qwendesk-engine", daemon=True)
        if self.device.type == "cuda":
            self._warm_up_linears()
        if self._spec is not None:          # every round the engine can run, captured now: never on a request's path
            self._spec.capture(lambda done, total: self._progress("Capturing speculative rounds", done, total))
        self._thread.start()
        if self.device.type == "cuda":
            try:
                self._warm_up()
            except LoadCancelled:
                self.close()
                raise
        self._cache.disk = self._disk          # after the warm-up: its prompts are not worth a disk write

    def _warm_up_linears(self) -> None:
        """Run each quantized weight shape at WARM_UP_ROWS (2 .. FUSED_MAX_M rows: a prompt's last step, a short chat
        turn): the int4 GEMV's build for M > 1 and the autotuned kernels' M buckets, which otherwise compile and tune
        on first use (seconds each); and each kind of MoE layer at 1 token, at WARM_UP_ROWS and at the token counts
        that reach each block size of the grouped kernels (qwendesk_kernels/moe_grouped.warm_up_tokens; the routing, decode and
        grouped kernels' builds serve every T; int8 experts: the sorted loop's GEMMs). Before the loop thread starts:
        the model is not yet shared."""
        moes = [m for m in self._model.modules() if isinstance(m, SparseMoE)]
        stacked = {id(lin) for m in moes for lin in (m.gate_up, m.down)}     # run by their layer, never whole
        linears = [m for m in self._model.modules()
                   if isinstance(m, Linear) and not isinstance(m, Embedding) and id(m) not in stacked]
        shapes = {(m.int4_tiles, m.quantized().shape): m for m in linears + [self._model.lm_head]
                  if m.scheme != "float"}
        kinds = {(m.gate_up.scheme, m.down.scheme): m for m in moes}
        with torch.inference_mode():
            for i, linear in enumerate(shapes.values()):
                self._progress("Tuning kernels", i, len(shapes))
                for rows in WARM_UP_ROWS:
                    linear(torch.zeros(rows, linear.shape[1], dtype=self._dtype, device=self.device))
            for moe in kinds.values():
                experts = moe.gate_up.shape[0] // (2 * moe.inter)                 # (+ the stacked shared one)
                grouped = warm_up_tokens(moe.pairs, experts, self.config.prefill_chunk)
                for rows in sorted({1, *WARM_UP_ROWS, *grouped}):
                    moe(torch.zeros(rows, moe.hidden, dtype=self._dtype, device=self.device))

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

    def _cache_identity(self) -> dict:
        """What the disk tier's entries depend on besides their chain hash (engine.disk_cache.namespace). An engine
        around a given model (from_model) is known by config.model's text."""
        path = Path(self.config.model)
        policy = self.config.policy(self.weights)
        return {"source": source_identity(path) if path.is_dir() else {"name": self.config.model},
                "weights": self.weights, "policy": policy.key() if policy is not None else None,
                "dtype": str(self._dtype), "layout": self._pools.layout()}

    @classmethod
    def from_model(cls, config: EngineConfig, model, tokenizer, template=None, vision=None) -> "Engine":
        """An engine around an already built model (benchmarks with random weights). vision: (VisionTower, its
        ImageProcessorConfig, placement: resident | on_demand); the tower on the device when resident, else on the
        CPU."""
        return cls(config, _parts=(model, tokenizer, template) + ((vision,) if vision else ()))

    # ---- public API (any thread) ---------------------------------------------------------
    def encode_prompt(self, prompt, tools=None, continue_final_message: bool = False, **template_kwargs) -> list[int]:
        """Token ids as given, or chat messages rendered with the checkpoint's template (with
        `continue_final_message`, the reply continues the last message, an assistant's cut-short reply,
        instead of starting a new one). Also how a caller counts a conversation's tokens."""
        if isinstance(prompt, str):
            raise TypeError("give token ids or chat messages (a list of {'role', 'content'} dicts), not a str")
        if prompt and isinstance(prompt[0], dict):
            text = self.template.render(prompt, tools=tools, add_generation_prompt=not continue_final_message,
                                        continue_final_message=continue_final_message, **template_kwargs)
            return self.tokenizer.encode(text)
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        return ids

    @property
    def accepts_images(self) -> bool:
        """The loaded checkpoint has a vision tower and it is on (EngineConfig.vision)."""
        return self._encoder is not None

    def process_images(self, images: list[bytes]) -> list[ProcessedImage]:
        """Encoded image files -> the tower's inputs, within the engine's limits (EngineConfig.max_images,
        max_image_bytes); ImageInputError (a ValueError, one line) for anything it cannot take. Any thread."""
        if not images:
            return []
        if self._encoder is None:
            raise ImageInputError(NO_VISION)
        limit = self.config.max_images
        if len(images) > limit:
            raise ImageInputError(f"the request has {len(images)} images; at most {limit} are allowed")
        big = next((i for i, data in enumerate(images) if len(data) > self.config.max_image_bytes), None)
        if big is not None:
            raise ImageInputError(f"image {big + 1} is {len(images[big]) / 2**20:.1f} MiB; at most "
                                  f"{self.config.max_image_bytes / 2**20:.1f} MiB per image are allowed")
        processed = []
        for i, data in enumerate(images):
            try:
                processed.append(process_image(data, self._image_config))
            except ImageInputError as e:
                raise ImageInputError(f"image {i + 1}: {e}" if len(images) > 1 else str(e)) from None
        return processed

    def expand_images(self, ids: list[int], images: list[ProcessedImage]) -> list[int]:
        """Token ids with one image placeholder per image (as the chat template writes them) -> the prompt the model
        reads: each placeholder repeated to its image's token count."""
        return expand_image_placeholders(ids, self.model_config.image_token_id, images) if images else ids

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
        ids, image_info = self._prompt(prompt, tools, images, template_kwargs)
        if len(ids) >= self.max_context:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens; the context holds {self.max_context} "
                                     f"(prompt plus at least one new token)")
        tok = self.tokenizer
        in_reasoning = starts_in_reasoning(ids, tok.think_start_id, tok.think_end_id)
        matcher = self._grammars.matcher(params.constraint, in_reasoning) if params.constraint else None
        with self._lock:
            if self._active >= self.config.max_running + self.config.max_queue:
                raise QueueFullError(f"the engine is busy: {self._active} requests in flight (profile "
                                     f"{self.config.profile} runs {self.config.max_running}, the queue holds "
                                     f"{self.config.max_queue} more); try again later")
            self._active += 1
            seq_id = self._next_id
            self._next_id += 1
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(id=seq_id, prompt=ids, params=params, seed=seed,
                       max_total=min(len(ids) + params.max_tokens, self.max_context), images=image_info,
                       on_event=on_event)
        seq.stream = OutputStream(tok, params, in_reasoning, tools)
        seq.matcher = matcher
        if params.thinking_budget == 0 and seq.stream.in_reasoning and tok.think_end_id is not None:
            seq.forced.extend([tok.think_end_id] + tok.encode("\n\n"))
        self._inbox.put(("submit", seq))
        return RequestHandle(self, seq)

    def _prompt(self, prompt, tools, images, template_kwargs) -> tuple[list[int], object]:
        """A request's token ids and its ImagePrompt (None without images): submit's and warm's."""
        if prompt and not isinstance(prompt, str) and isinstance(prompt[0], dict):
            if images:
                raise ValueError("images go inside chat messages as image parts, or with token ids")
            prompt, data = split_images(prompt)
            images = self.process_images(data)
            ids = self.expand_images(self.encode_prompt(prompt, tools=tools, **template_kwargs), images)
        else:
            ids = self.encode_prompt(prompt, tools=tools, **template_kwargs)
        if images and self._encoder is None:
            raise ImageInputError(NO_VISION)
        image_info = image_prompt(ids, list(images), self.model_config.image_token_id,
                                  self.model_config.vision.spatial_merge_size) if images else None
        return ids, image_info

    def cancel(self, request_id: int) -> None:
        self._inbox.put(("cancel", request_id))

    def set_draft_oracle(self, oracle, adaptive: bool = True) -> None:
        """Benchmarks and tests only: speculative drafts replaced per an engine.speculative.DraftOracle (None: the
        MTP's own again); adaptive False: every step speculates, paying or not. Call while no request runs."""
        if self._spec is None:
            raise RuntimeError("this engine does not speculate (speculative_tokens 0, or no MTP module)")
        self._spec.use_oracle(oracle, adaptive)

    def plan(self) -> MemoryPlan:
        """The memory plan the engine runs with (weights, KV, state, workspace, margin)."""
        return self._plan

    def stats(self) -> dict:
        with self._lock:
            stats = dict(self._stats)
        if self._disk is not None:          # its writer thread carries on while the loop idles: its figures now
            stats.update(self._disk.stats())
        if self.device.type == "cuda":      # torch's allocator, now: held by tensors, and reserved from the driver
            stats["gpu_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            stats["gpu_reserved_bytes"] = torch.cuda.memory_reserved(self.device)
            stats["pinned_host_bytes"] = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
        return stats

    def generate(self, prompt, params: SamplingParams | None = None, tools=None, **template_kwargs) -> GenerateOutput:
        """Submit and wait for the whole result."""
        params = params or SamplingParams()
        handle = self.submit(prompt, params, tools=tools, **template_kwargs)
        pieces, calls, ids, logprobs = [], [], [], []
        for ev in handle:
            pieces += ev.pieces
            add_calls(calls, ev.pieces)
            ids += ev.token_ids
            logprobs += ev.logprobs or []
            if ev.kind == "finish":
                if ev.finish_reason == "error":
                    raise RuntimeError(f"generation failed: {ev.error}")
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
        ids, image_info = self._prompt(prompt, tools, images, template_kwargs)
        done: Future = Future()
        self._inbox.put(("warm", image_info.hash_tokens if image_info else ids, done))
        return done

    def score(self, token_ids) -> torch.Tensor:
        """Logits of every position of one sequence, [len, vocab] float32 on the CPU."""
        ids = self.encode_prompt(token_ids)
        if len(ids) > self.max_context:
            raise ContextLengthError(f"{len(ids)} tokens exceed the context of {self.max_context}")
        done: Future = Future()
        self._inbox.put(("score", ids, done))
        return done.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inbox.put(("stop",))
        self._thread.join()
        if self._disk is not None:
            self._disk.close()                  # the writes queued so far are finished first
        # drop every reference to device memory (graphs, pools, cache), then give it back
        self._runner = self._model = self._pools = self._cache = self._scheduler = self._encoder = self._spec = None
        self._in_flight = self._encoding = None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the loop (engine thread) ---------------------------------------------------------
    def _loop(self) -> None:
        while True:
            block = not (self._scheduler.has_work() or self._warming)
            # disk reads in flight and nothing running: step every DISK_POLL_S, so that admission keeps what they read
            # (also for a request cancelled meanwhile) and looks again
            waiting_on_disk = self._cache.loading and not self._scheduler.running
            try:
                msg = self._inbox.get(timeout=DISK_POLL_S) if waiting_on_disk else self._inbox.get(block=block)
                while True:
                    if msg[0] == "stop":
                        self._fail_all("cancelled", None)
                        for _, done, _ in self._warming:
                            done.set_exception(RuntimeError("the engine stopped before the prefix was read"))
                        return
                    self._handle(msg)
                    msg = self._inbox.get_nowait()
            except queue.Empty:
                pass
            try:
                self._step()
            except Exception as e:  # keep serving: fail what was in flight, say why
                log.exception("engine step failed")
                self._fail_all("error", f"{type(e).__name__}: {e}")
            with self._lock:
                self._stats = self._collect_stats()

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "submit":
            seq = msg[1]
            self._seqs[seq.id] = seq
            self._scheduler.add(seq)
        elif kind == "cancel":
            seq = self._seqs.get(msg[1])
            if seq is not None:
                self._finish(seq, "cancelled")
        elif kind == "warm":
            self._warming.append([*msg[1:], -1])
        elif kind == "score":
            _, ids, done = msg
            try:
                done.set_result(self._score(ids))
            except Exception as e:
                done.set_exception(e)

    def _score(self, ids: list[int]) -> torch.Tensor:
        seq = Sequence(id=-1, prompt=ids, params=SamplingParams(), seed=0, max_total=len(ids))
        c, no_prefix = self._cache, PrefixHit()
        if not c.can_admit(no_prefix, len(ids)):
            raise RuntimeError("the engine is busy; no cache room to score now")
        seq.pages, seq.state_slot = c.admit(no_prefix, len(ids))
        try:
            c.grow(seq.pages, len(ids))
            return self._runner.forward([seq], [len(ids)], all_logits=True).cpu()
        finally:   # scored pages are not indexed for reuse
            c.release(pages=seq.pages, state_slot=seq.state_slot, total_tokens=len(ids), hashes=[], tokens=[],
                      num_computed=0)

    def _settle_warms(self) -> None:
        """Answer each warm() whose prefix the tiers now hold (its disk reads done), with the tokens it would reuse."""
        self._cache.collect_loads()
        for item in list(self._warming):
            ids, done, looked = item
            if looked == self._cache.reads_done:        # no read has finished since its last lookup
                continue
            try:
                hit = self._cache.match_prefix(ids)
            except Exception as e:
                self._warming.remove(item)
                done.set_exception(e)
                continue
            item[2] = self._cache.reads_done
            if not hit.loading:
                self._warming.remove(item)
                done.set_result(hit.tokens)

    def _step(self) -> None:
        if self._warming:
            self._settle_warms()
        now = time.perf_counter()
        for seq in self._scheduler.admit():
            seq.t_admit = now
        if self._encoder is not None:
            self._encode_images()
        # an image still being encoded holds its activations (on demand, the tower's weights too) between steps: the
        # plan gives them the prefill's workspace, so prompts wait for it (decoding goes on)
        mixed = self._encoding is not None
        seqs, lens, cuts = self._scheduler.prefill_batch() if self._encoding is None else ([], [], [])
        if seqs:
            mixed = True
            c, snapshots = self._cache, self._cache.snapshots
            snap_slots = [snapshots.take() if cut else -1 for cut in cuts]
            in_passing = [(cut, slot) if slot >= 0 else (0, -1) for cut, slot in zip(cuts, snap_slots)]
            try:
                logits = self._runner.forward(seqs, lens, snapshots=in_passing if any(s >= 0 for s in snap_slots)
                                              else None, prefill=True)
            except Exception:
                for slot in snap_slots:
                    if slot >= 0:
                        snapshots.drop(slot)
                raise
            done = []
            for i, seq in enumerate(seqs):
                c.index_pages(seq.hashes, seq.hash_tokens, seq.num_computed, seq.pages)
                if snap_slots[i] >= 0:           # taken in passing
                    snapshots.keep(snap_slots[i], self._snapshot_key(seq))
                elif seq.num_computed == seq.snapshot_at:      # the step ended at the boundary: copy the state
                    snapshots.save(seq.state_slot, self._snapshot_key(seq))
                if not seq.prefilling:
                    done.append(i)
            if done:
                ready = [seqs[i] for i in done]
                self._accept(ready, self._runner.sample(ready, logits[done], self._masks(ready)))
                if self._spec is not None:              # their first drafts, from the prompt's last hidden states
                    live = [i for i, s in zip(done, ready) if s.finish_reason is None]
                    if live:
                        self._spec.start([seqs[i] for i in live], self._runner.last_hidden[live])
        ran = self._decode(self._scheduler.decode_batch())
        if self._spec is not None:          # the speculation policy learns what a step of each kind takes
            if mixed or ran is None:
                self._spec.step_mixed()
            else:
                self._spec.step_done(*ran, time.perf_counter() - now)

    def _encode_images(self) -> None:
        """A step's share of the tower's work: the image that the first prefill waiting for one reaches next, encoded
        over as many steps as its size needs (engine/vision/encoder.py); its rows are prefilled once it is done."""
        if self._encoding is None:
            for seq in self._scheduler.running:
                pending = seq.pending_images(seq.num_computed, len(seq.prompt)) if seq.prefilling else []
                if pending:
                    self._encoding = (seq, pending[0], self._encoder.start(seq.images.images[pending[0]]))
                    break
        if self._encoding is not None:
            seq, k, encoding = self._encoding
            embeds = encoding.advance()
            if embeds is not None:
                seq.image_embeds[k] = embeds
                self._encoding = None

    def _decode(self, seqs: list[Sequence]) -> tuple[int, list[Sequence]] | None:
        """A decode step. When the host need not see the logits first (no logits processors, penalties, logprobs or
        forced tokens), the step samples on the GPU and stays in flight: the next step starts from those tokens
        still on the GPU, and the host reads, streams and checks them while it runs, so the GPU does not wait for
        the host between steps (~0.35 of 6.1 ms of an int4 C1 step on the H200). A sequence that a stop ends had one
        step too many run; its token is dropped. The steps before, with the tokens on the host, are taken where
        the batch changed, where a sequence may end by length, and where a step fills a page (the prefix cache
        hashes the page's tokens then). With speculation, the step may be a round of drafts instead (_speculate).
        Returns (drafts, sequences) of what ran (0 drafts: a plain step), None when nothing did."""
        k = self._spec.drafts(seqs) if self._spec is not None else 0
        if k:
            return self._speculate(seqs, k)
        flight, self._in_flight = self._in_flight, None
        ahead = int(flight is not None and self._can_follow(flight, seqs))
        if flight is not None and not ahead:
            self._accept_in_flight(flight)
            seqs = self._scheduler.decode_batch()
        if not seqs:
            return None
        for seq in seqs:
            self._cache.grow(seq.pages, seq.num_computed + 1)
        logits = self._runner.forward(seqs, [1] * len(seqs), input_ids=flight.ids if ahead else None)
        for seq in seqs:
            if seq.num_computed % self._cache.page_size == 0:
                self._rolling_snapshot(seq)
        if all(seq.sampled_on_device for seq in seqs):
            if ahead and any(seq.matcher is not None for seq in seqs):
                self._accept_in_flight(flight)      # the masks need those tokens: read them while this step runs
                ahead = 0
            ids = self._runner.sample_on_device(seqs, logits, ahead, mask=self._masks(seqs))
            self._in_flight = StepInFlight.launch(seqs, ids)
        else:
            self._accept(seqs, self._runner.sample(seqs, logits, self._masks(seqs)))
        if ahead:
            self._accept_in_flight(flight)
        return 0, seqs

    def _speculate(self, seqs: list[Sequence], k: int) -> tuple[int, list[Sequence]] | None:
        """A speculative round of k drafts (engine/speculation.py) instead of a decode step; a step in flight is taken
        first."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            self._accept_in_flight(flight)
            seqs = self._scheduler.decode_batch()
            if not (seqs and all(self._spec.eligible(s, k) for s in seqs)):
                return None
        bases = [s.num_computed for s in seqs]
        for seq, base, tokens in zip(seqs, bases, self._spec.round(seqs, k)):
            self._commit(seq, base, tokens)
        return k, seqs

    def _commit(self, seq: Sequence, base: int, tokens: list[int]) -> None:
        """A round's new tokens, one by one: each one's row is now in the cache; a stop, the length or an error may
        end the sequence before the last (the cache holds a little more than it then uses: nothing reads it)."""
        boundary = self._spec.boundary(seq)
        for i, token in enumerate(tokens):
            seq.num_computed = base + i + 1
            if seq.num_computed == boundary:
                self._spec.passed(seq)
            self._accept([seq], [token])
            if seq.finish_reason is not None:
                break
        self._spec.round_over(seq)

    def _masks(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The grammar masks of the sequences' next tokens (host, int32 [N, words]); None when none is constrained.
        A sequence that has ended (its step in flight is dropped) gets no mask."""
        if all(seq.matcher is None for seq in seqs):
            return None
        return self._grammars.masks([seq.matcher if seq.finish_reason is None else None for seq in seqs])

    def _can_follow(self, flight: StepInFlight, seqs: list[Sequence]) -> bool:
        """The next step can start from the tokens in flight: the same sequences, none that its token in flight
        may end by length, none whose next step fills a page."""
        page = self._cache.page_size
        return [s.id for s in seqs] == [s.id for s in flight.seqs] and all(
            s.sampled_on_device and (s.num_computed + 1) % page and len(s.output) + 1 < s.params.max_tokens
            and len(s) + 1 < s.max_total for s in seqs)

    def _accept_in_flight(self, flight: StepInFlight) -> None:
        """Read a step's tokens (waiting for that step only) and accept those of the sequences still running; a
        forced token (thinking budget) set meanwhile replaces the sampled one."""
        live = [(s, t) for s, t in zip(flight.seqs, flight.tokens()) if s.finish_reason is None]
        self._accept([s for s, _ in live], [s.forced.popleft() if s.forced else t for s, t in live])

    def _snapshot_key(self, seq: Sequence) -> bytes:
        """The hash of the page ending at the prompt's snapshot boundary (that page is indexed by now)."""
        return seq.hashes[seq.snapshot_at // self._cache.page_size - 1]

    def _rolling_snapshot(self, seq: Sequence) -> None:
        """Decode just passed a page boundary: index the full page and copy the state into the rolling snapshot
        (promoted to the end-of-turn snapshot when the sequence ends: CacheManager.release)."""
        self._cache.index_pages(seq.hashes, seq.hash_tokens, seq.num_computed, seq.pages)
        seq.rolling_slot = self._cache.snapshots.roll(seq.state_slot, seq.rolling_slot)

    def _accept(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """Append each sampled token, stream its text, and finish sequences that are done."""
        now = time.perf_counter()
        tok = self.tokenizer
        for seq, token in zip(seqs, tokens):
            p = seq.params
            if seq.error:
                self._finish(seq, "error", seq.error)
                continue
            if not seq.output:
                seq.t_first = now
            seq.append(token)
            reason, kind, pieces = None, "control", []
            if token in p.stop_token_ids or (not p.ignore_eos and token in tok.eos_token_ids):
                reason = "stop"
            else:
                kind, pieces = seq.stream.push(token)
                if seq.matcher is not None and not seq.matcher.advance(token, kind):
                    seq.error = f"the grammar refused token {token}: {seq.matcher.error}"
                    reason = "error"
                elif seq.stream.stopped or (seq.matcher is not None and seq.matcher.done):
                    reason = "stop"
                elif len(seq.output) >= p.max_tokens or len(seq) >= seq.max_total:
                    reason = "length"
            if (p.thinking_budget is not None and seq.stream.in_reasoning and not seq.forced
                    and seq.stream.reasoning_tokens >= p.thinking_budget and tok.think_end_id is not None):
                seq.forced.extend(tok.encode("\n") + [tok.think_end_id] + tok.encode("\n\n"))
            logprobs = seq.logprobs[-1:] if p.logprobs is not None else None
            seq.emit(StreamEvent("delta", pieces, token_ids=[token], token_kinds=[kind], logprobs=logprobs))
            if reason:
                self._finish(seq, reason, seq.error)

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        """End a request: give back what it holds and send its finish event. The event goes out even when the
        ending itself fails (the detokenizer's flush, the cache release), as an error: else the caller would wait
        for ever, and a failed step's _fail_all would stop at the first such request and take the loop down. A reply
        that stopped after making tool calls finishes with "tool_calls"."""
        pieces = []
        try:
            if reason in ("stop", "length"):
                pieces = seq.stream.finish()
                if reason == "stop" and seq.stream.made_calls:
                    reason = "tool_calls"
            self._scheduler.remove(seq)
        except Exception as e:
            log.exception("ending request %d failed", seq.id)
            reason, error = "error", error or f"{type(e).__name__}: {e}"
        self._seqs.pop(seq.id, None)
        seq.image_embeds.clear()
        if self._encoding is not None and self._encoding[0] is seq:
            self._encoding[2].close()
            self._encoding = None
        now = time.perf_counter()
        n_out = len(seq.output)
        usage = Usage(prompt_tokens=len(seq.prompt), completion_tokens=n_out, cached_tokens=seq.cached_tokens,
                      reasoning_tokens=seq.stream.reasoning_tokens,
                      speculation=seq.spec_counts if seq.spec_counts.rounds else None)
        t = Timings(total_ms=1e3 * (now - seq.t_submit))
        if seq.t_admit:
            t.queue_ms = 1e3 * (seq.t_admit - seq.t_submit)
        if seq.t_first:
            t.ttft_ms = 1e3 * (seq.t_first - seq.t_submit)
            computed = len(seq.prompt) - seq.cached_tokens
            t.prefill_tok_s = computed / max(seq.t_first - seq.t_admit, 1e-9)
            if n_out > 1:
                t.decode_tok_s = (n_out - 1) / max(now - seq.t_first, 1e-9)
        seq.finish_reason = reason
        with self._lock:
            self._active -= 1
        seq.emit(StreamEvent("finish", pieces, finish_reason=reason, stop_sequence=seq.stream.stop_sequence,
                             usage=usage, timings=t, error=error))

    def _fail_all(self, reason: str, error: str | None) -> None:
        self._in_flight = None
        for seq in list(self._seqs.values()):
            self._finish(seq, reason, error)

    def _collect_stats(self) -> dict:
        s = self._scheduler
        spec = self._spec.stats() if self._spec is not None else {"spec_drafts": 0}
        images = {"images_encoded": self._encoder.encoded} if self._encoder is not None else {}
        return {"running": len(s.running), "waiting": len(s.waiting), **self._cache.stats(), **spec, **images}

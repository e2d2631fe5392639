"""The engine's loop thread: it takes messages from the inbox, then runs a step, for ever. A step admits waiting
requests, advances an image's encoding, prefills a chunk of prompts, then decodes: a plain step or a speculative
round, each left in flight and read by the next step, after it launched the next one from it where it can. Only this
thread touches the model, the cache and the scheduler; other threads reach it through `post` and read `stats`."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from engine.cache.manager import CacheManager, PrefixHit
from engine.core.messages import Cancel, Message, Score, SetDraftOracle, Stop, Submit, Warm
from engine.core.output import OutputStage
from engine.core.params import EngineConfig, FinishReason, QueueFullError, SamplingParams
from engine.core.runner import ModelRunner, StepInFlight
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.spec.speculation import RoundInFlight, Speculation
from engine.text.grammar import Grammars
from engine.text.tokenizer import Tokenizer
from engine.vision.encoder import Encoding, ImageEncoder

log = logging.getLogger("qwendesk.engine")
DISK_POLL_S = 0.002     # how often an otherwise idle loop looks whether the disk tier's reads are done


@dataclass
class Requests:
    """The count of requests submitted and not finished, and their ids (any thread, under the lock)."""
    limit: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: int = 0
    next_id: int = 0


class EngineLoop:
    def __init__(self, config: EngineConfig, tokenizer: Tokenizer, grammars: Grammars, scheduler: Scheduler,
                 cache: CacheManager, runner: ModelRunner, spec: Speculation | None, encoder: ImageEncoder | None):
        self.config, self.scheduler, self.cache, self.runner = config, scheduler, cache, runner
        self.spec, self.encoder = spec, encoder
        self.output = OutputStage(tokenizer, grammars, scheduler, ended=self._ended)
        self.requests = Requests(limit=config.max_running + config.max_queue)
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._seqs: dict[int, Sequence] = {}
        self._in_flight: StepInFlight | RoundInFlight | None = None   # see _decode and _speculate
        self._encoding: tuple[Sequence, int, Encoding] | None = None   # the image being encoded (its sequence, index)
        self._warming: list[Warm] = []
        self._stats = self._collect_stats()
        self._thread = threading.Thread(target=self._run, name="qwendesk-engine", daemon=True)

    # ---- any thread ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def post(self, message: Message) -> None:
        self._inbox.put(message)

    def take_id(self) -> int:
        """A new request's id, counted as active until it finishes; QueueFullError when the engine is full."""
        r, c = self.requests, self.config
        with r.lock:
            if r.active >= r.limit:
                raise QueueFullError(f"the engine is busy: {r.active} requests in flight (profile {c.profile} runs "
                                     f"{c.max_running}, the queue holds {c.max_queue} more); try again later")
            r.active += 1
            r.next_id += 1
            return r.next_id - 1

    def stats(self) -> dict:
        with self.requests.lock:
            return dict(self._stats)

    def stop(self) -> None:
        """End the loop thread: requests in flight finish as cancelled. Then drop what it holds of the device."""
        self._inbox.put(Stop())
        self._thread.join()
        del self.scheduler, self.cache, self.runner, self.output
        self.spec = self.encoder = None
        self._in_flight = self._encoding = None

    # ---- the loop thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            block = not (self.scheduler.has_work() or self._warming or self._in_flight)
            # disk reads in flight and nothing running: step every DISK_POLL_S, so that admission keeps what they read
            # (also for a request cancelled meanwhile) and looks again
            waiting_on_disk = self.cache.loading and not self.scheduler.running
            try:
                msg = self._inbox.get(timeout=DISK_POLL_S) if waiting_on_disk else self._inbox.get(block=block)
                while True:
                    if isinstance(msg, Stop):
                        self.fail_all("cancelled", None)
                        for warm in self._warming:
                            warm.done.set_exception(RuntimeError("the engine stopped before the prefix was read"))
                        return
                    self._handle(msg)
                    msg = self._inbox.get_nowait()
            except queue.Empty:
                pass
            try:
                self.step()
            except Exception as e:  # keep serving: fail what was in flight, say why
                log.exception("engine step failed")
                self.fail_all("error", f"{type(e).__name__}: {e}")
            stats = self._collect_stats()
            with self.requests.lock:
                self._stats = stats

    def step(self) -> None:
        """One step of the loop: admit, encode, prefill, decode (and let the speculation policy learn its time)."""
        if self._warming:
            self._settle_warms()
        now = time.perf_counter()
        for seq in self.scheduler.admit():
            seq.t_admit = now
        if self.encoder is not None:
            self._encode_images(self.encoder)
        # an image still being encoded holds its activations (on demand, the tower's weights too) between steps: the
        # plan gives them the prefill's workspace, so prompts wait for it (decoding goes on)
        mixed = self._encoding is not None or self._prefill()
        ran = self._decode(self.scheduler.decode_batch())
        if self.spec is not None:          # the speculation policy learns what a step of each kind takes
            if mixed or ran is None:
                self.spec.step_mixed()
            else:
                self.spec.step_done(*ran, time.perf_counter() - now)

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, Submit):
            self._seqs[msg.seq.id] = msg.seq
            self.scheduler.add(msg.seq)
        elif isinstance(msg, Cancel):
            seq = self._seqs.get(msg.request_id)
            if seq is not None:
                self.output.finish(seq, "cancelled")
        elif isinstance(msg, Warm):
            self._warming.append(msg)
        elif isinstance(msg, Score):
            try:
                msg.done.set_result(self._score(msg.ids))
            except Exception as e:
                msg.done.set_exception(e)
        elif isinstance(msg, SetDraftOracle):
            try:
                assert self.spec is not None, "set_draft_oracle on an engine that does not speculate"
                self._settle()                  # a round in flight reads the graphs the oracle's come recaptures
                self.spec.use_oracle(msg.oracle, msg.adaptive)
                msg.done.set_result(None)
            except Exception as e:
                msg.done.set_exception(e)

    def _prefill(self) -> bool:
        """A chunk of the prompts being prefilled; the prompts it ends are sampled. False when none was waiting."""
        seqs, lens, cuts = self.scheduler.prefill_batch()
        if not seqs:
            return False
        c, snapshots = self.cache, self.cache.snapshots
        snap_slots = [snapshots.take() if cut else -1 for cut in cuts]
        in_passing = [(cut, slot) if slot >= 0 else (0, -1) for cut, slot in zip(cuts, snap_slots)]
        try:
            logits = self.runner.forward(seqs, lens, snapshots=in_passing if any(s >= 0 for s in snap_slots)
                                         else None, prefill=True)
        except Exception:
            for slot in snap_slots:
                if slot >= 0:
                    snapshots.drop(slot)
            raise
        done = []
        for i, seq in enumerate(seqs):
            c.index_pages(seq.hashes, seq.hash_tokens, seq.num_computed, seq.pages)
            if snap_slots[i] >= 0:           # taken in passing (a drafter's rings still hold the window before it)
                c.pools.copy_rings(seq.state_slot, snap_slots[i])
                snapshots.keep(snap_slots[i], self._snapshot_key(seq))
            elif seq.num_computed == seq.snapshot_at:      # the step ended at the boundary: copy the state
                snapshots.save(seq.state_slot, self._snapshot_key(seq))
            if not seq.prefilling:
                done.append(i)
        if done:
            ready = [seqs[i] for i in done]
            self.output.accept(ready, self.runner.sample(ready, logits[done], self.output.masks(ready)))
            if self.spec is not None:              # their first drafts, from the prompt's last hidden states
                live = [i for i, s in zip(done, ready) if s.finish_reason is None]
                if live:
                    hidden = self.runner.last_hidden
                    assert hidden is not None           # a prefill step keeps its logits rows' hidden states
                    self.spec.start([seqs[i] for i in live], hidden[live])
        return True

    def _decode(self, seqs: list[Sequence]) -> tuple[int, list[Sequence]] | None:
        """A decode step. When the host need not see the logits first (no logits processors, penalties, logprobs or
        forced tokens), the step samples on the GPU and stays in flight: the next step starts from those tokens
        still on the GPU, and the host reads, streams and checks them while it runs, so the GPU does not wait for
        the host between steps (~0.35 of 6.1 ms of an int4 C1 step on the H200). A sequence that a stop ends had one
        step too many run; its token is dropped. The steps before, with the tokens on the host, are taken where
        the batch changed, where a sequence may end by length, and where a step fills a page (the prefix cache
        hashes the page's tokens then). With speculation, the step may be a round of drafts instead (_speculate).
        Returns (drafts, sequences) of what ran (0 drafts: a plain step), None when nothing did."""
        k = self.spec.drafts(seqs) if self.spec is not None else 0
        if self.spec is not None and k:
            return self._speculate(self.spec, seqs, k)
        if isinstance(self._in_flight, RoundInFlight):
            self._settle()
            seqs = self.scheduler.decode_batch()
        flight, self._in_flight = self._in_flight, None
        assert not isinstance(flight, RoundInFlight)     # (settled above)
        ahead = flight if flight is not None and self._can_follow(flight, seqs) else None   # the next step follows it
        if flight is not None and ahead is None:
            self._accept_in_flight(flight)
            seqs = self.scheduler.decode_batch()
        if not seqs:
            return None
        for seq in seqs:
            self.cache.grow(seq.pages, seq.num_computed + 1)
        logits = self.runner.forward(seqs, [1] * len(seqs), input_ids=ahead.ids if ahead is not None else None)
        for seq in seqs:
            if seq.num_computed % self.cache.page_size == 0:
                self._page_passed(seq)
        if all(seq.sampled_on_device for seq in seqs):
            if ahead is not None and any(seq.matcher is not None for seq in seqs):
                self._accept_in_flight(ahead)       # the masks need those tokens: read them while this step runs
                ahead = None
            ids = self.runner.sample_on_device(seqs, logits, int(ahead is not None), mask=self.output.masks(seqs))
            self._in_flight = StepInFlight.launch(seqs, ids)
        else:
            self.output.accept(seqs, self.runner.sample(seqs, logits, self.output.masks(seqs)))
        if ahead is not None:
            self._accept_in_flight(ahead)
        return 0, seqs

    def _can_follow(self, flight: StepInFlight, seqs: list[Sequence]) -> bool:
        """The next step can start from the tokens in flight: the same sequences, none that its token in flight
        may end by length, none whose next step fills a page."""
        page = self.cache.page_size
        return [s.id for s in seqs] == [s.id for s in flight.seqs] and all(
            s.sampled_on_device and (s.num_computed + 1) % page and len(s.output) + 1 < s.params.max_tokens
            and len(s) + 1 < s.max_total for s in seqs)

    def _accept_in_flight(self, flight: StepInFlight) -> None:
        """Read a step's tokens (waiting for that step only) and accept those of the sequences still running; a
        forced token (thinking budget) set meanwhile replaces the sampled one."""
        live = [(s, t) for s, t in zip(flight.seqs, flight.tokens()) if s.finish_reason is None]
        self.output.accept([s for s, _ in live], [s.forced.popleft() if s.forced else t for s, t in live])

    def _speculate(self, spec: Speculation, seqs: list[Sequence], k: int) -> tuple[int, list[Sequence]] | None:
        """A speculative round of k drafts (engine/spec/speculation.py) instead of a decode step, left in flight. A
        round in flight of the same sequences is read and committed after this one is launched from it, where it can
        be (Speculation.can_follow): the GPU then runs this round while the host streams that one's tokens (the
        GPU had waited ~0.8 ms before each 10 ms int4 C1 round on the H100); else what is in flight is taken first."""
        flight = self._in_flight
        if isinstance(flight, RoundInFlight) and spec.can_follow(flight, seqs, k):
            self._in_flight = spec.launch(seqs, k, after=flight)
            self._commit_round(spec, flight)
            return k, seqs
        if flight is not None:
            self._settle()
            seqs = self.scheduler.decode_batch()
            if not (seqs and all(spec.eligible(s, k) for s in seqs)):
                return None
        self._in_flight = spec.launch(seqs, k)
        return k, seqs

    def _settle(self) -> None:
        """Read and take what is in flight: a plain step's tokens, or a round's."""
        flight, self._in_flight = self._in_flight, None
        if isinstance(flight, StepInFlight):
            self._accept_in_flight(flight)
        elif flight is not None:
            assert self.spec is not None                # only a speculating engine launches rounds
            self._commit_round(self.spec, flight)

    def _commit_round(self, spec: Speculation, flight: RoundInFlight) -> None:
        for seq, tokens in zip(flight.seqs, spec.finish(flight)):
            self._commit(spec, seq, tokens)

    def _commit(self, spec: Speculation, seq: Sequence, tokens: list[int]) -> None:
        """A round's new tokens, one by one: each one's row is now in the cache; a stop, the length or an error may
        end the sequence before the last (the cache holds a little more than it then uses: nothing reads it)."""
        boundary, base = spec.boundary(seq), seq.num_computed
        for i, token in enumerate(tokens):
            seq.num_computed = base + i + 1
            if seq.num_computed == boundary:
                self._page_passed(seq, taken=spec.passed(seq))
            self.output.accept([seq], [token])
            if seq.finish_reason is not None:
                break
        spec.round_over(seq)

    def _snapshot_key(self, seq: Sequence) -> bytes:
        """The hash of the page ending at the prompt's snapshot boundary (that page is indexed by now)."""
        return seq.hashes[seq.snapshot_at // self.cache.page_size - 1]

    def _page_passed(self, seq: Sequence, taken: int | None = None) -> None:
        """Decode just passed a page boundary: index the full page and make the state there the rolling snapshot
        (promoted to the end-of-turn snapshot when the sequence ends: CacheManager.release): copied from the live
        slot after a plain step (`taken` None), or the slot a speculative round filled at the boundary (`taken`; -1:
        it had none, so there is no state of this boundary). The older one is given back: it is not the state at
        the sequence's last indexed page any more."""
        self.cache.index_pages(seq.hashes, seq.hash_tokens, seq.num_computed, seq.pages)
        if taken is None:
            seq.rolling_slot = self.cache.snapshots.roll(seq.state_slot, seq.rolling_slot)
            return
        if seq.rolling_slot >= 0:
            self.cache.snapshots.drop(seq.rolling_slot)
        seq.rolling_slot = taken

    def _encode_images(self, encoder: ImageEncoder) -> None:
        """A step's share of the tower's work: the image that the first prefill waiting for one reaches next, encoded
        over as many steps as its size needs (engine/vision/encoder.py); its rows are prefilled once it is done."""
        if self._encoding is None:
            for seq in self.scheduler.running:
                pending = seq.pending_images(seq.num_computed, len(seq.prompt)) if seq.prefilling else []
                if pending:
                    assert seq.images is not None           # pending images are its prompt's
                    self._encoding = (seq, pending[0], encoder.start(seq.images.images[pending[0]]))
                    break
        if self._encoding is not None:
            seq, k, encoding = self._encoding
            embeds = encoding.advance()
            if embeds is not None:
                seq.image_embeds[k] = embeds
                self._encoding = None

    def _settle_warms(self) -> None:
        """Answer each warm() whose prefix the tiers now hold (its disk reads done), with the tokens it would reuse."""
        self.cache.collect_loads()
        for warm in list(self._warming):
            if warm.looked == self.cache.reads_done:        # no read has finished since its last lookup
                continue
            try:
                hit = self.cache.match_prefix(warm.ids)
            except Exception as e:
                self._warming.remove(warm)
                warm.done.set_exception(e)
                continue
            warm.looked = self.cache.reads_done
            if not hit.loading:
                self._warming.remove(warm)
                warm.done.set_result(hit.tokens)

    def _score(self, ids: list[int]) -> torch.Tensor:
        seq = Sequence(id=-1, prompt=ids, params=SamplingParams(), seed=0, max_total=len(ids))
        c, no_prefix = self.cache, PrefixHit()
        if not c.can_admit(no_prefix, len(ids)):
            raise RuntimeError("the engine is busy; no cache room to score now")
        seq.pages, seq.state_slot = c.admit(no_prefix, len(ids))
        try:
            c.grow(seq.pages, len(ids))
            return self.runner.forward([seq], [len(ids)], all_logits=True).cpu()
        finally:   # scored pages are not indexed for reuse
            c.release(pages=seq.pages, state_slot=seq.state_slot, total_tokens=len(ids), hashes=[], tokens=[],
                      num_computed=0)

    def _ended(self, seq: Sequence) -> None:
        """A request has ended (OutputStage.finish): forget it and what it was having encoded."""
        self._seqs.pop(seq.id, None)
        seq.image_embeds.clear()
        if self._encoding is not None and self._encoding[0] is seq:
            self._encoding[2].close()
            self._encoding = None
        stats = self._collect_stats()
        with self.requests.lock:        # stats() agrees with the events: a request whose finish is out is not counted
            self.requests.active -= 1
            self._stats = stats

    def fail_all(self, reason: FinishReason, error: str | None) -> None:
        flight, self._in_flight = self._in_flight, None
        if isinstance(flight, RoundInFlight) and self.spec is not None:
            self.spec.abandon(flight)
        for seq in list(self._seqs.values()):
            self.output.finish(seq, reason, error)

    def _collect_stats(self) -> dict:
        s = self.scheduler
        spec = self.spec.stats() if self.spec is not None else {"spec_method": "off", "spec_drafts": 0}
        images = {"images_encoded": self.encoder.encoded} if self.encoder is not None else {}
        return {"running": len(s.running), "waiting": len(s.waiting), **self.cache.stats(), **spec, **images}

"""The output stage: what happens to each token a step makes. It is appended and streamed as labelled text; stop
tokens, stop strings, the grammar, the length and errors end the request; a thinking budget that runs out forces
</think>; an ending request gives back what it holds and gets its finish event, with its usage and timings."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from engine.core.params import FinishReason, Piece, SamplingParams, StreamEvent, Timings, TokenKind, Usage
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, submitted
from engine.text.grammar import Grammars, Matcher
from engine.text.output_stream import OutputStream, starts_in_reasoning
from engine.text.tokenizer import Tokenizer

log = logging.getLogger("qwendesk.engine")


class OutputStage:
    def __init__(self, tokenizer: Tokenizer, grammars: Grammars, scheduler: Scheduler,
                 ended: Callable[[Sequence], None]):
        """ended(seq): the loop forgets a request that has ended (before its finish event goes out)."""
        self.tokenizer, self.grammars, self.scheduler, self.ended = tokenizer, grammars, scheduler, ended

    def open(self, ids: list[int], params: SamplingParams, tools) -> tuple[OutputStream, Matcher | None]:
        """A new request's output stream and grammar state (any thread; a bad constraint raises ValueError here)."""
        tok = self.tokenizer
        in_reasoning = starts_in_reasoning(ids, tok.think_start_id, tok.think_end_id)
        matcher = self.grammars.matcher(params.constraint, in_reasoning) if params.constraint else None
        return OutputStream(tok, params, in_reasoning, tools), matcher

    def start(self, seq: Sequence) -> None:
        """A thinking budget of 0: the reply closes its think block at once."""
        tok, stream = self.tokenizer, submitted(seq)
        if seq.params.thinking_budget == 0 and stream.in_reasoning and tok.think_end_id is not None:
            seq.forced.extend([tok.think_end_id] + tok.encode("\n\n"))

    def masks(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The grammar masks of the sequences' next tokens (host, int32 [N, words]); None when none is constrained.
        A sequence that has ended (its step in flight is dropped) gets no mask."""
        if all(seq.matcher is None for seq in seqs):
            return None
        return self.grammars.masks([seq.matcher if seq.finish_reason is None else None for seq in seqs])

    def accept(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """Append each sampled token, stream its text, and finish sequences that are done."""
        now = time.perf_counter()
        tok = self.tokenizer
        for seq, token in zip(seqs, tokens):
            p, stream = seq.params, submitted(seq)
            if seq.error:
                self.finish(seq, "error", seq.error)
                continue
            if not seq.output:
                seq.t_first = now
            seq.append(token)
            reason: FinishReason | None = None
            kind: TokenKind = "control"
            pieces: list[Piece] = []
            if token in p.stop_token_ids or (not p.ignore_eos and token in tok.eos_token_ids):
                reason = "stop"
            else:
                kind, pieces = stream.push(token)
                if seq.matcher is not None and not seq.matcher.advance(token, kind):
                    seq.error = f"the grammar refused token {token}: {seq.matcher.error}"
                    reason = "error"
                elif stream.stopped or (seq.matcher is not None and seq.matcher.done):
                    reason = "stop"
                elif len(seq.output) >= p.max_tokens or len(seq) >= seq.max_total:
                    reason = "length"
            if (p.thinking_budget is not None and stream.in_reasoning and not seq.forced
                    and stream.reasoning_tokens >= p.thinking_budget and tok.think_end_id is not None):
                seq.forced.extend(tok.encode("\n") + [tok.think_end_id] + tok.encode("\n\n"))
            logprobs = seq.logprobs[-1:] if p.logprobs is not None else None
            seq.emit(StreamEvent("delta", pieces, token_ids=[token], token_kinds=[kind], logprobs=logprobs))
            if reason:
                self.finish(seq, reason, seq.error)

    def finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        """End a request: give back what it holds and send its finish event. The event goes out even when the
        ending itself fails (the detokenizer's flush, the cache release), as an error: else the caller would wait
        for ever, and a failed step's fail_all would stop at the first such request and take the loop down. A reply
        that stopped after making tool calls finishes with "tool_calls"."""
        stream = submitted(seq)
        pieces: list[Piece] = []
        try:
            if reason in ("stop", "length"):
                pieces = stream.finish()
                if reason == "stop" and stream.made_calls:
                    reason = "tool_calls"
            self.scheduler.remove(seq)
        except Exception as e:
            log.exception("ending request %d failed", seq.id)
            reason, error = "error", error or f"{type(e).__name__}: {e}"
        self.ended(seq)
        usage = Usage(prompt_tokens=len(seq.prompt), completion_tokens=len(seq.output),
                      cached_tokens=seq.cached_tokens, reasoning_tokens=stream.reasoning_tokens,
                      speculation=seq.spec_counts if seq.spec_counts.rounds else None)
        seq.finish_reason = reason
        seq.emit(StreamEvent("finish", pieces, finish_reason=reason, stop_sequence=stream.stop_sequence,
                             usage=usage, timings=timings(seq, time.perf_counter()), error=error))


def timings(seq: Sequence, now: float) -> Timings:
    """A finished request's times: in the queue, to its first token, and its prefill and decode speeds."""
    t = Timings(total_ms=1e3 * (now - seq.t_submit))
    if seq.t_admit:
        t.queue_ms = 1e3 * (seq.t_admit - seq.t_submit)
    if seq.t_first:
        t.ttft_ms = 1e3 * (seq.t_first - seq.t_submit)
        computed = len(seq.prompt) - seq.cached_tokens
        t.prefill_tok_s = computed / max(seq.t_first - seq.t_admit, 1e-9)
        n_out = len(seq.output)
        if n_out > 1:
            t.decode_tok_s = (n_out - 1) / max(now - seq.t_first, 1e-9)
    return t

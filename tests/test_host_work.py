"""The engine's host work per step does not grow with the context: a prefill chunk and a decode step (plain and
speculative) cost the host about the same at 8K and at 128K tokens of context, and a sequence's token storage is
appended to, never rebuilt.

The engine runs as it does on a GPU, but around a model that does no device work (`HostOnlyModel`: the real model's
interface, zeros out), so what a step costs is the host's: the scheduler, the cache manager, the batch and round
inputs, sampling and streaming. Before these tests the MTP prompt rows read `Sequence.tokens` (a fresh prompt + output
list) twice per row, so a 128K prompt's prefill was quadratic on the host and did not finish.
"""

import statistics
import time

import pytest
import torch

from engine.api import Engine, EngineConfig, SamplingParams
from engine.model.config import parse_model_config
from engine.bench.random_model import bench_tokenizer, text_config
from engine.core.sequence import Sequence

CHUNK, PAGE = 1024, 64
SHORT, LONG = 8192, 131072
VOCAB = 1024                     # the stand-in tokenizer's


class _Head(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def first_rows(self, hidden: torch.Tensor, n: int) -> torch.Tensor:
        return torch.zeros(hidden.shape[0], min(n, self.vocab))


class HostOnlyModel(torch.nn.Module):
    """Qwen3_5Model's interface with no device work: hidden states and logits of zeros (every token is 0, every draft
    right), the cache untouched."""

    def __init__(self):
        super().__init__()
        self.cfg = parse_model_config({**text_config("tiny"), "vocab_size": VOCAB})
        self.mtp = torch.nn.Identity()
        self.drafter = None                                   # no block drafter
        self.lm_head = _Head(VOCAB)
        self.anchor = torch.nn.Parameter(torch.zeros(1))      # a parameter, so that the engine finds a dtype

    def forward(self, input_ids, batch, pools):
        return torch.zeros(input_ids.shape[0], self.cfg.hidden_size)

    def logits(self, hidden):
        return torch.zeros(hidden.shape[0], VOCAB)

    def mtp_forward(self, next_ids, hidden, batch, pools):
        return torch.zeros(next_ids.shape[0], self.cfg.hidden_size)


@pytest.fixture(scope="module", params=[0, 3], ids=["plain", "speculative"])
def engine(request):
    config = EngineConfig(model="host-only", device="cpu", dtype="float32", max_context=LONG + 2 * CHUNK,
                          prefill_chunk=CHUNK, page_size=PAGE, speculative_tokens=request.param, host_cache_gb=0)
    eng = Engine.from_model(config, HostOnlyModel(), bench_tokenizer())
    assert eng.drafts == request.param
    if request.param:
        eng.set_draft_oracle(None, adaptive=False)    # every decode step a round (the policy would mix in plain steps)
    yield eng
    eng.close()


def step_times(eng, prompt_len: int, new_tokens: int, seed: int) -> tuple[list[float], list[float]]:
    """(host seconds of each full prefill chunk but the first, of each decode step but the first two) of one request.
    Each call needs its own `seed`: a prompt seen before is a prefix-cache hit, with no prefill chunks to time."""
    prefill, decode, real = [], [], eng._loop.step

    def timed():
        running = eng._scheduler.running
        seq = running[0] if running else None
        t0 = time.perf_counter()
        real()
        if seq is None:
            return
        if seq.prefilling and 0 < seq.num_computed - CHUNK and seq.num_computed < len(seq.prompt):
            prefill.append(time.perf_counter() - t0)            # (seq.num_computed is after the step)
        elif len(seq.output) > 2 and seq.finish_reason is None:
            decode.append(time.perf_counter() - t0)

    eng._loop.step = timed
    try:
        prompt = torch.randint(1, VOCAB, (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
        out = eng.generate(prompt, SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True))
    finally:
        del eng._loop.step
    assert len(out.token_ids) == new_tokens and len(prefill) >= prompt_len // CHUNK - 3 and len(decode) >= 16
    return prefill, decode


def test_host_work_per_step_does_not_grow_with_the_context(engine):
    """Up to three interleaved 8K / 128K pairs, the best pair counting: a busy machine slows one run now and then
    (CI shares 2 cores), while host work that grows with the context is 16x at 128K in every pair."""
    ratios = []
    for attempt in range(3):
        short_prefill, short_decode = step_times(engine, SHORT, 96, seed=2 * attempt)
        long_prefill, long_decode = step_times(engine, LONG, 96, seed=2 * attempt + 1)
        prefill = statistics.median(long_prefill) / statistics.median(short_prefill)
        decode = statistics.median(long_decode) / statistics.median(short_decode)
        print(f"drafts {engine.drafts}: prefill chunk {1e3 * statistics.median(short_prefill):.2f} -> "
              f"{1e3 * statistics.median(long_prefill):.2f} ms ({prefill:.2f}x), decode step "
              f"{1e3 * statistics.median(short_decode):.3f} -> {1e3 * statistics.median(long_decode):.3f} ms "
              f"({decode:.2f}x)")
        ratios.append((prefill, decode))
        if prefill < 1.5 and decode < 1.5:
            return
    pytest.fail(f"host work grows with the context in every pair (prefill, decode ratios 128K / 8K): {ratios}")


def test_a_sequences_tokens_are_appended_to_never_copied():
    seq = Sequence(id=0, prompt=list(range(LONG)), params=SamplingParams(), seed=0)
    tokens = seq.tokens
    assert seq.hash_tokens is tokens and tokens is not seq.prompt
    for t in range(5):
        seq.append(t)
    assert seq.tokens is tokens and tokens[LONG:] == seq.output == list(range(5)) and len(seq.prompt) == LONG
    t0 = time.perf_counter()
    for _ in range(10_000):
        seq.tokens[LONG // 2]                  # noqa: B018 (an index: O(1), where a rebuilt list was O(context))
    assert time.perf_counter() - t0 < 0.05

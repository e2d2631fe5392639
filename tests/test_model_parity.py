"""Our decoder against transformers' Qwen3_5ForCausalLM on tiny random checkpoints (fp32, CPU)."""

import pytest
import torch
from transformers import Qwen3_5ForCausalLM

from engine.api import Engine, EngineConfig, SamplingParams
from tests.fixtures.checkpoints import SPECS
from tests.fixtures.hf_pairs import HFPairs, rel_err

NAMES = list(SPECS)


@pytest.fixture(scope="module")
def pair(checkpoint):
    pairs = HFPairs(checkpoint, Qwen3_5ForCausalLM)
    yield lambda name: pairs(name)[:2]
    pairs.close()


@pytest.mark.parametrize("name", NAMES)
def test_score_matches_transformers(pair, name):
    eng, hf = pair(name)
    ids = torch.randint(0, eng.model_config.vocab_size, (77,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    ours = eng.score(ids.tolist())
    assert ours.shape == ref.shape and ours.dtype == torch.float32
    assert rel_err(ours, ref) < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generate_matches_transformers(pair, name):
    eng, hf = pair(name)
    ids = torch.randint(0, eng.model_config.vocab_size, (19,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf.generate(ids[None], attention_mask=torch.ones(1, 19, dtype=torch.long), max_new_tokens=32,
                          do_sample=False)[0, 19:].tolist()
    out = eng.generate(ids.tolist(), SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    assert out.token_ids == ref
    assert out.finish_reason == "length"


def chosen_logprobs(out):
    return torch.tensor([lp.logprob for lp in out.logprobs])


@pytest.mark.parametrize("name", NAMES)
def test_incremental_decode_equals_full_forward(pair, name):
    """Prefill 20 tokens, then 32 single-token decode steps: each step's logprobs equal those of
    one full forward over the whole sequence."""
    eng, _ = pair(name)
    ids = torch.randint(0, eng.model_config.vocab_size, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    out = eng.generate(ids, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, logprobs=0))
    full = torch.log_softmax(eng.score(ids + out.token_ids), dim=-1)
    ref = full[19:19 + 32].gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert (chosen_logprobs(out) - ref).abs().max().item() < 1e-4


def test_chunked_prefill_equals_one_pass(pair, checkpoint):
    eng, _ = pair("gqa3_ratio3")
    chunked = Engine(EngineConfig(model=str(checkpoint("gqa3_ratio3")), device="cpu", dtype="float32",
                                  prefill_chunk=37))
    ids = torch.randint(0, eng.model_config.vocab_size, (150,), generator=torch.Generator().manual_seed(4)).tolist()
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=5)
    a, b = eng.generate(ids, params), chunked.generate(ids, params)
    chunked.close()
    assert a.token_ids == b.token_ids
    assert (chosen_logprobs(a) - chosen_logprobs(b)).abs().max().item() < 1e-4

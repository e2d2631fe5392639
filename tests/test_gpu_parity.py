"""GPU: our bf16 model (Triton kernels on CUDA) against transformers in the same process."""

import pytest
import torch

from engine.api import Engine, EngineConfig, SamplingParams
from engine.bench import randomize_, text_config
from engine.config import parse_model_config
from engine.model.qwen3_5 import Qwen3_5Model
from engine.weights.loader import load_state_dict

pytestmark = pytest.mark.gpu


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.mark.parametrize("name", ["base", "gqa3_ratio3"])
def test_small_checkpoint_bf16_matches_transformers(checkpoint, name):
    from transformers import Qwen3_5ForCausalLM
    path = checkpoint(name)
    hf = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    eng = Engine(EngineConfig(model=str(path), device="cuda", dtype="bfloat16", max_context=2048))
    try:
        ids = torch.randint(0, eng.model_config.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = hf(ids[None].cuda()).logits[0].float().cpu()
        assert rel_err(eng.score(ids.tolist()), ref) < 2e-2
        out = eng.generate(ids.tolist(), SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=0))
        full = torch.log_softmax(eng.score(ids.tolist() + out.token_ids), -1)
        chosen = full[299:299 + 16].gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        assert (torch.tensor([lp.logprob for lp in out.logprobs]) - chosen).abs().max() < 5e-2
    finally:
        eng.close()


def test_27b_shapes_one_forward_matches_transformers():
    """All 64 layers at the real 27B widths, random weights shared with transformers (bf16)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    raw = text_config("27b")
    with torch.device("cuda"):
        hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{k: v for k, v in raw.items() if k != "model_type"}))
    hf = hf.to(torch.bfloat16).eval()
    ours = Qwen3_5Model(parse_model_config(raw), torch.bfloat16, "cuda")
    randomize_(ours)  # realistic scales, then copy into transformers so both hold the same weights
    with torch.no_grad():
        state = hf.state_dict()
        for name, param, row, shape in ours.checkpoint_slices():
            full = name if name == "lm_head.weight" else "model." + name
            state[full].reshape(-1)[:] = param[row:row + shape[0]].reshape(-1)
    load_state_dict(ours, state)
    ids = torch.randint(0, 248000, (512,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None].cuda(), logits_to_keep=64).logits[0].float()
    del hf, state
    torch.cuda.empty_cache()
    eng = Engine.from_model(EngineConfig(model="", device="cuda", max_context=1024), ours, _tokenizer())
    try:
        got = eng.score(ids.tolist())[-64:]
    finally:
        eng.close()
    assert rel_err(got, ref.cpu()) < 2e-2


def _tokenizer():
    from engine.bench import bench_tokenizer
    return bench_tokenizer()

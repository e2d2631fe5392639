"""GPU: our bf16 model (Triton kernels on CUDA) against transformers in the same process."""

import pytest
import torch

from engine.api import Engine, EngineConfig, SamplingParams
from engine.bench import text_config
from engine.config import parse_model_config
from engine.model.qwen3_5 import Qwen3_5Model
from engine.weights.loader import load_state_dict

pytestmark = pytest.mark.gpu


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.mark.parametrize("name", ["base", "gqa3_ratio3", "calm128"])
def test_small_checkpoint_bf16_is_as_close_to_fp32_as_transformers_bf16(checkpoint, name):
    """The random fixtures are chaotic: transformers' own bf16 logits differ from its fp32 ones by
    0.1-0.25 (max-abs relative). Ours in bf16 must be about as close to the fp32 truth."""
    from transformers import Qwen3_5ForCausalLM
    path = checkpoint(name)
    ids = torch.randint(0, 600, (300,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref32 = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()(ids[None].cuda()).logits[0]
        ref16 = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()(ids[None].cuda()).logits[0]
    eng = Engine(EngineConfig(model=str(path), device="cuda", dtype="bfloat16", max_context=2048))
    try:
        ours = eng.score(ids.tolist())
        out = eng.generate(ids.tolist(), SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=0))
        full = torch.log_softmax(eng.score(ids.tolist() + out.token_ids), -1)
    finally:
        eng.close()
    floor = rel_err(ref16.cpu(), ref32.cpu())
    assert rel_err(ours, ref32.cpu()) < 1.5 * floor + 1e-2
    chosen = full[299:299 + 16].gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert (torch.tensor([lp.logprob for lp in out.logprobs]) - chosen).abs().max() < 5e-2   # graphs == eager


def test_27b_shapes_one_forward_matches_transformers():
    """All 64 layers at the real 27B widths, transformers' own random init copied into ours (bf16)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    raw = text_config("27b")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)     # built in fp32 and cast, the two copies would not fit 141 GB
    try:
        with torch.device("cuda"):
            hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{k: v for k, v in raw.items() if k != "model_type"}))
    finally:
        torch.set_default_dtype(default)
    hf = hf.to(torch.bfloat16).eval()
    ours = Qwen3_5Model(parse_model_config(raw), torch.bfloat16, "cuda")
    load_state_dict(ours, hf.state_dict())
    ids = torch.randint(0, 248000, (512,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None].cuda(), logits_to_keep=64).logits[0].float()
    del hf
    torch.cuda.empty_cache()
    eng = Engine.from_model(EngineConfig(model="", device="cuda", max_context=1024), ours, _tokenizer())
    try:
        got = eng.score(ids.tolist())[-64:]
    finally:
        eng.close()
    err = rel_err(got, ref.cpu())
    print(f"27B shapes, bf16, ours vs transformers: max-abs relative error {err:.4f}")
    assert err < 2e-2


def _tokenizer():
    from engine.bench import bench_tokenizer
    return bench_tokenizer()

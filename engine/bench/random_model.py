"""Models at real shapes with random weights, for the benchmarks (no checkpoint needed): the published 27B's
shape, a 9B-style one and the 35B-A3B mixture of experts, with the published vision tower, and a tiny one for CPU
runs of the same paths; a stand-in tokenizer; random prompts."""

from __future__ import annotations

import math
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3.6-27B (published config)
    "27b": dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=17408, num_attention_heads=24,
                num_key_value_heads=4, linear_num_value_heads=48),
    # transformers' Qwen3_5TextConfig defaults ("Qwen3.5-9B style")
    "9b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=12288, num_attention_heads=16,
               num_key_value_heads=4, linear_num_value_heads=32),
    # Qwen3.5-35B-A3B: transformers' Qwen3_5MoeTextConfig defaults (mixture of experts, ~3B active per token)
    "35b-a3b": dict(model_type="qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                    num_key_value_heads=2, linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                    moe_intermediate_size=512, shared_expert_intermediate_size=512),
}
# every dimension small (the CPU runs of what the real shapes run on a GPU: bench_http, the soak), the real vocabulary
TINY: dict[str, Any] = dict(hidden_size=128, num_hidden_layers=4, intermediate_size=256, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=32, linear_value_head_dim=32)


# the published checkpoints' vision tower (27B and 35B-A3B alike; out_hidden_size is the language model's width)
VISION = {"depth": 27, "hidden_size": 1152, "num_heads": 16, "intermediate_size": 4304, "patch_size": 16,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3, "num_position_embeddings": 2304}
# their preprocessor_config.json's sizes: images of 65,536 to 16,777,216 pixels
PREPROCESSOR = {"min_pixels": 65536, "max_pixels": 16777216, "patch_size": 16, "temporal_patch_size": 2,
                "merge_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
IMAGE_TOKEN_ID = 248056


def wrapper_config(shape: str) -> dict:
    """The multimodal checkpoint's config.json (`qwen3_5` or `qwen3_5_moe`): text_config and the vision tower's."""
    text = text_config(shape)
    moe = text["model_type"].startswith("qwen3_5_moe")
    return {"model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": text,
            "vision_config": {**VISION, "out_hidden_size": text["hidden_size"]}, "image_token_id": IMAGE_TOKEN_ID}


def text_config(shape: str) -> dict:
    """The config.json of `shape`: one of SHAPES, or "tiny"."""
    return {"model_type": "qwen3_5_text", "vocab_size": 248320, "head_dim": 256, "linear_num_key_heads": 16,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "full_attention_interval": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
            "tie_word_embeddings": False, "mtp_num_hidden_layers": 1, "eos_token_id": 248046,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10]}, **(TINY if shape == "tiny" else SHAPES[shape])}


@torch.no_grad()
def randomize_(model, seed: int = 0) -> None:
    """Fill every weight with random values of a realistic scale (never time on zeros); quantized
    weights get random codes, scales and zeros."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty_like(p).uniform_(1, 16, generator=gen).log())
        elif p.dim() == 1:
            p.normal_(0, 0.1, generator=gen)
            if name.endswith("norm_weight"):
                p.add_(1)
        else:
            p.normal_(0, 1 / math.sqrt(p.shape[-1]), generator=gen)
    for name, b in model.named_buffers():
        if name.endswith("qweight"):
            info = torch.iinfo(b.dtype)
            b.copy_(torch.randint(info.min, info.max, b.shape, generator=gen, device=device, dtype=b.dtype))
        elif name.endswith("scales"):
            b.uniform_(0.5, 1.5, generator=gen).mul_(0.01)
        elif name.endswith("zeros"):
            b.uniform_(7, 9, generator=gen)


def build_random_model(raw: dict, weights: str, check: bool = True, mtp: bool = False, device="cuda",
                       dtype: torch.dtype = torch.bfloat16):
    """The model of config `raw` on `device` with random weights (16-bit: `dtype`, or int4 per the default policy);
    mtp: with its MTP module (an engine around it speculates)."""
    from engine.model.config import parse_model_config
    from engine.model.qwen3_5 import Qwen3_5Model
    from engine.core.params import EngineConfig
    policy = EngineConfig(model="").policy(weights)
    model = Qwen3_5Model(parse_model_config(raw), dtype, device, with_mtp=mtp, policy=policy)
    randomize_(model)
    if policy is not None and check:
        check_quantized_linear(model)
    return model


# z-lab/Qwen3.5-27B-DFlash's size as issue #45 gives it (5 layers, 32 / 8 heads of 128, ~1.73 B parameters: an MLP
# of 17,408; 16-row blocks, 4 sliding layers of 2,048 and one full one, reading target layers 1, 16, 31, 46, 61):
# layers, heads, kv heads, head dim, MLP width, taps. Not checked against the checkpoint itself (no network here);
# its mask token id is a stand-in.
DRAFTERS = {"27b": (5, 32, 8, 128, 17408, [1, 16, 31, 46, 61])}


def drafter_config(shape: str, taps: list[int] | None = None) -> dict:
    """The config.json of a drafter of DRAFTERS[shape]'s size (reading `taps` of the target: default the
    published ones)."""
    layers, heads, kv, head_dim, inter, published = DRAFTERS[shape]
    target = text_config(shape)
    return dict(architectures=["DFlashDraftModel"], vocab_size=target["vocab_size"], hidden_size=target["hidden_size"],
                intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                head_dim=head_dim, sliding_window=2048, layer_types=["sliding_attention"] * (layers - 1) + [
                    "full_attention"], rope_theta=1e7,
                dflash_config={"target_layer_ids": taps or published, "block_size": 16, "mask_token_id": 248077})


def build_random_drafter(shape: str, weights: str, device="cuda", dtype: torch.dtype = torch.bfloat16):
    """A block drafter at the published size for `shape`'s target, random weights, held as the engine holds it with
    `weights` (int4: its projections' codes, scales and zeros random, as the target's)."""
    from engine.core.params import EngineConfig
    from engine.model.block_drafter import BlockDrafter
    from engine.model.linear import Build
    from engine.model.drafter_config import parse_drafter_config
    policy = EngineConfig(model="").policy(weights)
    drafter = BlockDrafter(parse_drafter_config(drafter_config(shape)), Build(dtype, device, policy))
    randomize_(drafter)
    return drafter.eval()


def build_random_tower(vision, weights: str, placement: str):
    """The vision tower of VisionConfig `vision`, random, under the weights' policy: built on the GPU, then moved to
    the host when on demand (engine.vision.encoder.ImageEncoder pins it there)."""
    from engine.model.linear import Build
    from engine.core.params import EngineConfig
    from engine.vision.tower import VisionTower
    tower = VisionTower(vision, Build(torch.bfloat16, "cuda", EngineConfig(model="").policy(weights)))
    randomize_(tower)
    return tower.eval().to("cuda" if placement == "resident" else "cpu")


def check_quantized_linear(model) -> None:
    """The int4 / int8 kernels against dequantize + matmul on this model's own weights (M = 1, 8, 64)."""
    for lin in (model.layers[0].mlp.gate_up, model.layers[3].attn.qkv, model.lm_head):
        w = lin.dequantized().float()
        for m in (1, 8, 64):
            x = torch.randn(m, lin.shape[1], device=w.device, dtype=torch.bfloat16)
            ref = x.float() @ w.T
            err = ((lin(x).float() - ref).norm() / ref.norm()).item()
            if not err < 2e-2:
                raise AssertionError(f"{lin.prefix}{'|'.join(lin.parts)} ({lin.scheme}) M={m}: rel err {err:.3g}")
    print("quantized linears match dequantize + matmul", flush=True)


def bench_tokenizer():
    """A stand-in tokenizer: the benchmark feeds token ids; text only needs to decode."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    from engine.text.tokenizer import Tokenizer
    return Tokenizer(HFTokenizer(WordLevel({f"t{i}": i for i in range(1024)}, unk_token="t0")))


def rand_ids(n, seed):
    return torch.randint(0, 248000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()

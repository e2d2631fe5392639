"""What each KV format costs in quality, measured on the CPU: `python -m engine.bench.kv_quality [--steps 300]`.

1. Attention output against fp32 on K/V with real models' structure (a few channels 10-50x the rest): relative
   error ||o - o_fp32|| / ||o_fp32|| per format, group size and with / without the Hadamard rotation.
2. A tiny qwen3_5 model (transformers' Qwen3_5ForCausalLM, bytes as tokens; every layer full attention, so that
   every layer reads the format, and transformers' torch GDN fallback, far too slow on a CPU, is not needed) trained
   for --steps CPU steps on the Python standard library's sources: held-out loss with each KV format, and its ratio
   to bf16 KV.
3. Greedy agreement of that model over long generations: the share of generated tokens equal to bf16 KV's, and the
   first position where they differ.

Every format is applied as the kernels store it (qwendesk_kernels/attention_kv4.py and attention.py references):
K/V rotated, quantized, dequantized and rotated back, which is what attention over the stored pools computes
(H orthogonal: the rotation of q and of the output cancels). The kernels' agreement with these references is in
tests/test_kernels_attention*.py. docs/performance.md (KV formats) has the numbers and this command.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import math
import os
import sysconfig
import time
from typing import Any

import torch

from engine.cache.kv_format import KV4_GROUP
from qwendesk_kernels.attention import quantize_int8_ref
from qwendesk_kernels.attention_kv4 import dequantize_int4_ref, quantize_int4_ref, rotate

FORMATS = ("bf16", "int8", "k8v4", "k4v4")


def roundtrip(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """x [..., D] as the pool would give it back: bits 16 (bf16), 8 (one scale per row) or 4 (group scales)."""
    if bits == 16:
        return x.bfloat16().to(x.dtype)
    if bits == 8:
        q, s = quantize_int8_ref(x)
        return (q.float() * s[..., None]).to(x.dtype)
    return dequantize_int4_ref(*quantize_int4_ref(x, group)).to(x.dtype)


def kv_roundtrip(k, v, fmt: str, group: int = KV4_GROUP, rotated: bool = True):
    """K, V [..., D] through format `fmt` ("fp32" leaves them as they are)."""
    if fmt == "fp32":
        return k, v
    k_bits, v_bits = {"bf16": (16, 16), "int8": (8, 8), "k8v4": (8, 4), "k4v4": (4, 4)}[fmt]
    if rotated and v_bits == 4:
        return (rotate(roundtrip(rotate(k), k_bits, group)), rotate(roundtrip(rotate(v), v_bits, group)))
    return roundtrip(k, k_bits, group), roundtrip(v, v_bits, group)


# --- 1. attention output on structured K/V ----------------------------------------------------------

def structured_kv(n: int, d: int, seed: int):
    """K and V [n, d]: unit Gaussian channels, four of them 10, 20, 35, 50x larger (K) and two 10, 20x (V), each
    with a per-channel offset as real keys have."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, d, generator=g) + torch.randn(d, generator=g)
    v = torch.randn(n, d, generator=g)
    ch = torch.randperm(d, generator=g)
    k[:, ch[:4]] *= torch.tensor([10.0, 20.0, 35.0, 50.0])
    v[:, ch[4:6]] *= torch.tensor([10.0, 20.0])
    return k, v


def attention_error(fmt: str, group: int, rotated: bool, n=4096, d=256, rows=64, seeds=3) -> float:
    """Mean relative error of softmax(q k^T / sqrt(d)) v over `seeds` draws (queries: unit Gaussian, scaled
    so that the scores spread over a few units, as trained models' do)."""
    errs = []
    for seed in range(seeds):
        k, v = structured_kv(n, d, seed)
        q = torch.randn(rows, d, generator=torch.Generator().manual_seed(100 + seed)) / k.std(0).clamp(min=1)
        ref = torch.softmax(q @ k.T / math.sqrt(d), -1) @ v
        kq, vq = kv_roundtrip(k, v, fmt, group, rotated)
        o = torch.softmax(q @ kq.T / math.sqrt(d), -1) @ vq
        errs.append(((o - ref).norm() / ref.norm()).item())
    return sum(errs) / len(errs)


def study_attention() -> list[tuple[str, float]]:
    rows = [("bf16", attention_error("bf16", 32, False)), ("int8", attention_error("int8", 32, False))]
    for fmt in ("k8v4", "k4v4"):
        for group in (32, 64, 128):
            for rotated in (False, True):
                rows.append((f"{fmt} group {group}{' rotated' if rotated else ''}",
                             attention_error(fmt, group, rotated)))
    return rows


# --- 2 and 3. a tiny trained model ---------------------------------------------------------------

_FORMAT: dict[str, Any] = {"fmt": "fp32", "group": KV4_GROUP, "rotated": True}


def _kvq_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention over K/V put through the current format (key, value [B, Hkv, T, D])."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    key, value = kv_roundtrip(key, value, _FORMAT["fmt"], _FORMAT["group"], _FORMAT["rotated"])
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def corpus(limit_bytes: int = 3_000_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes of the standard library's .py files (sorted; every 10th file held out)."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    train, held = bytearray(), bytearray()
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            (held if i % 10 == 0 else train).extend(fh.read())
        if len(train) > limit_bytes:
            break
    return torch.tensor(list(train), dtype=torch.long), torch.tensor(list(held), dtype=torch.long)


def tiny_model(seed: int = 0):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register("kvq", _kvq_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register("kvq", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(vocab_size=256, hidden_size=128, num_hidden_layers=4, intermediate_size=384,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=128, linear_num_key_heads=2,
                            linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                            full_attention_interval=1, max_position_embeddings=4096, tie_word_embeddings=True,
                            attn_implementation="kvq")
    return Qwen3_5ForCausalLM(cfg)


def train(model, data: torch.Tensor, steps: int, seq: int = 128, batch: int = 8, lr: float = 3e-3) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    model.train()
    loss = float("nan")
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / steps))
        start = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq + 1] for s in start.tolist()])
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1].clone()).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            print(f"step {step}: training loss {loss.item():.3f}", flush=True)
    model.eval()
    return float(loss)


@torch.no_grad()
def held_out_loss(model, data: torch.Tensor, seq: int = 512, count: int = 8) -> float:
    """Mean next-byte loss over `count` held-out windows of `seq` bytes."""
    losses = []
    for i in range(count):
        s = i * (len(data) - seq - 1) // count
        x = data[s:s + seq][None]
        losses.append(float(model(input_ids=x, labels=x.clone()).loss))
    return sum(losses) / len(losses)


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new: int) -> list[int]:
    out = model.generate(prompt[None], max_new_tokens=new, do_sample=False, min_new_tokens=new, pad_token_id=0)
    return out[0, prompt.shape[0]:].tolist()


def study_model(steps: int, gen_tokens: int, prompts: int):
    train_data, held = corpus()
    model = tiny_model()
    t0 = time.time()
    _FORMAT.update(fmt="fp32")
    final = train(model, train_data, steps)
    print(f"trained {steps} steps in {time.time() - t0:.0f} s, last training loss {final:.3f}", flush=True)
    cases = [("fp32", True, KV4_GROUP), ("bf16", True, KV4_GROUP), ("int8", True, KV4_GROUP)] + [
        (fmt, rotated, group) for fmt in ("k8v4", "k4v4") for rotated, group in ((False, KV4_GROUP), (True, 32),
                                                                                  (True, KV4_GROUP))]
    losses, gens = {}, {}
    for fmt, rotated, group in cases:
        _FORMAT.update(fmt=fmt, rotated=rotated, group=group)
        name = fmt + (f" g{group}" + (" rotated" if rotated else "") if fmt in ("k8v4", "k4v4") else "")
        losses[name] = held_out_loss(model, held)
        gens[name] = [greedy(model, held[i * 5000:i * 5000 + 64], gen_tokens) for i in range(prompts)]
    base = gens["bf16"]
    print(f"\nheld-out loss (8 windows of 512 bytes), greedy agreement with bf16 KV ({prompts} prompts x "
          f"{gen_tokens} tokens)")
    print(f"{'KV':<20} {'loss':>7} {'/ bf16':>7} {'same tokens':>12} {'first diff (mean)':>18}")
    for name, loss in losses.items():
        same = sum(a == b for g, h in zip(gens[name], base) for a, b in zip(g, h)) / (prompts * gen_tokens)
        first = [next((i for i, (a, b) in enumerate(zip(g, h)) if a != b), gen_tokens)
                 for g, h in zip(gens[name], base)]
        print(f"{name:<20} {loss:7.4f} {loss / losses['bf16']:7.4f} {same:12.1%} {sum(first) / len(first):18.0f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="training steps of the tiny model (0: attention only)")
    ap.add_argument("--gen-tokens", type=int, default=128, help="greedy tokens per prompt")
    ap.add_argument("--prompts", type=int, default=3)
    args = ap.parse_args(argv)
    print("attention output vs fp32, K/V with outlier channels (D 256, 4096 keys, 64 queries, 3 draws)")
    for name, err in study_attention():
        print(f"{name:<28} {err:.4f}")
    if args.steps and importlib.util.find_spec("transformers") is None:
        print("note: skipping the tiny model (parts 2-3): they need the transformers package (a test extra)")
    elif args.steps:
        study_model(args.steps, args.gen_tokens, args.prompts)


if __name__ == "__main__":
    main()

"""Paged attention benchmarks at the 27B shapes (`python -m qwendesk_kernels.bench attention`).

Hq 24, Hkv 4, head_dim 256, page 64, pages in shuffled order. Decode (L = 1) is counted by the K/V bytes
it must read (+ the int8 scales) and replayed from a CUDA graph (store_kv excluded), as the engine runs
it; its torch baseline is SDPA on K/V gathered into contiguous tensors beforehand, and the int8 cases are
compared with the bf16 kernel instead (the "vs ref" column is then int8's speed-up over bf16). Prefill is
counted by the causal flops, 4 * D * Hq per (query, visible key) pair, and run eagerly; its baseline is
SDPA (flash) on contiguous K/V with the kv heads repeated beforehand.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from qwendesk_kernels.attention import paged_attention
from qwendesk_kernels.bench import Case, graph_replay

HQ, HKV, D, PAGE = 24, 4, 256, 64
SCALE = D ** -0.5
DEV = "cuda"


def _paged(batch, length, quant):
    """Random pools holding `batch` sequences of `length` tokens in shuffled pages, + tables and lengths."""
    pages = -(-length // PAGE)
    shape = (batch * pages, PAGE, HKV, D)
    if quant:
        pools = {"k_cache": torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV),
                 "v_cache": torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV),
                 "k_scale": 0.01 + 0.01 * torch.rand(shape[:3], device=DEV),
                 "v_scale": 0.01 + 0.01 * torch.rand(shape[:3], device=DEV)}
    else:
        pools = {"k_cache": torch.randn(shape, dtype=torch.bfloat16, device=DEV),
                 "v_cache": torch.randn(shape, dtype=torch.bfloat16, device=DEV)}
    tables = torch.randperm(batch * pages, device=DEV).int().view(batch, pages)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=DEV)
    return pools, tables, seq_lens


def _contiguous(cache, tables, length, heads=HKV):
    """[B, heads, length, D] copy of the paged cache (kv heads repeated up to `heads`)."""
    kv = cache[tables.long()].flatten(1, 2)[:, :length].transpose(1, 2)
    return kv.repeat_interleave(heads // HKV, dim=1).contiguous()


def _decode(batch, length, quant):
    pools, tables, seq_lens = _paged(batch, length, quant)
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=DEV)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=DEV)
    replay = graph_replay(lambda: paged_attention(q, pools["k_cache"], pools["v_cache"], tables, cu, seq_lens, SCALE,
                                                  k_scale=pools.get("k_scale"), v_scale=pools.get("v_scale"),
                                                  decode_q_len=1, max_seq_len=length))
    kv_bytes = 2 * batch * length * HKV * (D * (1 if quant else 2) + (4 if quant else 0))
    return replay, kv_bytes, (q, pools, tables)


def _sdpa_decode(q, pools, tables, length):
    k = _contiguous(pools["k_cache"], tables, length)
    v = _contiguous(pools["v_cache"], tables, length)
    q4 = q.unsqueeze(2)
    k, v = k.repeat_interleave(HQ // HKV, dim=1), v.repeat_interleave(HQ // HKV, dim=1)
    return lambda: F.scaled_dot_product_attention(q4, k, v, scale=SCALE)   # eager: SDPA in a graph is not ours


def _decode_cases():
    cases = []
    for length in (32768, 4096):
        big = length == 32768
        for batch in (1, 8):
            name = f"decode_b{batch}_{length // 1024}k"
            bf16, nbytes, (q, pools, tables) = _decode(batch, length, quant=False)
            cases.append(Case("attention", name + "_bf16", bf16, bytes=nbytes,
                              baseline=_sdpa_decode(q, pools, tables, length),
                              target=">= 70% of copy bw (K/V read), vs SDPA" if big else "(no target), vs SDPA",
                              target_frac=0.7 if big else None))
            int8, nbytes, _ = _decode(batch, length, quant=True)
            cases.append(Case("attention", name + "_int8", int8, bytes=nbytes, baseline=bf16,
                              target=">= 70% of copy bw; vs ref = vs bf16 kernel, want >= 1.7x" if big
                              else "(no target), vs ref = vs bf16 kernel", target_frac=0.7 if big else None))
    return cases


def _prefill(cached, new, quant):
    """One sequence: `new` query rows on top of `cached` tokens (all keys already in the pages)."""
    pools, tables, seq_lens = _paged(1, cached + new, quant)
    q = torch.randn(new, HQ, D, dtype=torch.bfloat16, device=DEV)
    cu = torch.tensor([0, new], dtype=torch.int32, device=DEV)
    pairs = new * cached + new * new / 2

    def run():
        return paged_attention(q, pools["k_cache"], pools["v_cache"], tables, cu, seq_lens, SCALE,
                               k_scale=pools.get("k_scale"), v_scale=pools.get("v_scale"))

    baseline: Callable[[], object] | None = None
    if not quant:
        from torch.nn.attention.bias import causal_lower_right
        k = _contiguous(pools["k_cache"], tables, cached + new, HQ)
        v = _contiguous(pools["v_cache"], tables, cached + new, HQ)
        q4 = q.transpose(0, 1).unsqueeze(0)
        mask = causal_lower_right(new, cached + new)

        def sdpa():
            return F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, scale=SCALE)
        baseline = sdpa
    kind = "int8" if quant else "bf16"
    name = f"prefill_{new // 1024}k" + (f"_on_{cached // 1024}k" if cached else "") + f"_{kind}"
    return Case("attention", name, run, flops=4 * D * HQ * pairs, baseline=baseline,
                target=">= 40% of bf16 matmul peak" + (", vs SDPA flash" if baseline else ""), target_frac=0.4)


def cases() -> list[Case]:
    # the largest prefill first: the prefill kernel autotunes on its first call per shape family
    return [_prefill(0, 8192, False), _prefill(0, 8192, True), _prefill(6144, 2048, False),
            _prefill(6144, 2048, True), *_decode_cases()]

"""The 4-bit KV formats (k8v4, k4v4) through the engine: layouts and bytes, the planner's choice (kv_dtype="auto")
and its 24 GiB plans for the 27B, pages through the byte tiers, and a CPU engine that runs on them."""

import pytest
import torch

from engine.api import Engine, SamplingParams
from engine.model.config import parse_model_config
from engine.core.device import DeviceInfo
from engine.cache.kv_format import KVFormat
from engine.cache.pages import CacheTensors
from engine.core.memory import GIB, plan_for
from engine.core.params import EngineConfig
from engine.bench.random_model import text_config

GREEDY = dict(temperature=0.0)


def test_bytes_per_token_of_the_27b():
    """16 full-attention layers x 4 kv heads of 256: bf16 64 KiB, int8 ~32.5, k8v4 ~24.8, k4v4 17 KiB (scales in)."""
    cfg = parse_model_config(text_config("27b"))
    per = {kv: 16 * 4 * KVFormat(kv).bytes_per_head_token(cfg.head_dim, torch.bfloat16) / 1024
           for kv in ("bf16", "int8", "k8v4", "k4v4")}
    assert per == {"bf16": 64.0, "int8": 32.5, "k8v4": 24.75, "k4v4": 17.0}


@pytest.mark.parametrize("kv", ["k8v4", "k4v4"])
def test_pools_have_the_layout_the_planner_counts(kv):
    cfg = parse_model_config(text_config("tiny"))
    pools = CacheTensors.allocate(cfg, 3, 16, 2, torch.float32, "cpu", mtp_layers=1, kv=KVFormat(kv))
    per_token = (len(cfg.full_attention_layers) + 1) * cfg.num_kv_heads * KVFormat(kv).bytes_per_head_token(
        cfg.head_dim, torch.float32)
    assert pools.page_nbytes == 16 * per_token
    assert pools.v.dtype == torch.uint8 and pools.v.shape[-1] == cfg.head_dim // 2
    assert pools.k.dtype == (torch.int8 if kv == "k8v4" else torch.uint8)


def test_pages_of_4bit_pools_come_back_bit_for_bit():
    """What the host-RAM and disk tiers store: read_pages / write_pages bytes."""
    cfg = parse_model_config(text_config("tiny"))
    pools = CacheTensors.allocate(cfg, 4, 8, 2, torch.float32, "cpu", kv=KVFormat.K8V4)
    g = torch.Generator().manual_seed(0)
    for t in (pools.k, pools.v, pools.k_scale, pools.v_scale):
        t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=g, dtype=torch.uint8))
    want = [t[:, [1, 3]].clone() for t in (pools.k, pools.v, pools.k_scale, pools.v_scale)]
    data = pools.read_pages([1, 3])
    for t in (pools.k, pools.v, pools.k_scale, pools.v_scale):
        t.zero_()
    pools.write_pages([2, 0], data)
    got = [t[:, [2, 0]] for t in (pools.k, pools.v, pools.k_scale, pools.v_scale)]
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))


def qwen27b_on(free_gib):
    from tests.test_quantize import QWEN36_27B
    return parse_model_config(QWEN36_27B), DeviceInfo("cuda", "RTX 3090", 24 * GIB, int(free_gib * GIB))


@pytest.mark.parametrize("free_gib", [23.5, 22.5])
def test_27b_reaches_its_native_context_on_a_24gib_card(free_gib):
    """The published 27B as the app loads it on a 24 GiB card (int4, MTP drafts, the tower on demand), headless (23.5
    GiB free) or driving a display (22.5): kv_dtype="auto" plans the native 262,144 tokens at C1 with k4v4."""
    cfg, card = qwen27b_on(free_gib)
    p = plan_for(EngineConfig(model="", profile="C1", kv_dtype="auto"), card, model=cfg)
    assert p.weights == "int4" and p.drafts == 3 and p.vision == "on_demand", p.summary()
    assert p.fits and p.kv_dtype == "k4v4" and p.max_context == 262144 and p.total_bytes <= free_gib * GIB
    k8v4 = plan_for(EngineConfig(model="", profile="C1", kv_dtype="k8v4"), card, model=cfg)
    assert k8v4.fits and k8v4.max_context > 180_000, k8v4.summary()
    c4 = plan_for(EngineConfig(model="", profile="C4", kv_dtype="k4v4"), card, model=cfg)
    assert c4.fits and c4.max_context >= (64 * 1024 if free_gib == 23.5 else 60_000), c4.summary()
    print(f"\n27B, {free_gib} GiB free: C1 {p.kv_dtype} {p.max_context}, C1 k8v4 {k8v4.max_context}, "
          f"C4 k4v4 {c4.max_context} each")


@pytest.mark.parametrize("asked,want", [(32768, "bf16"), (120_000, "int8"), (180_000, "k8v4"), (250_000, "k4v4")])
def test_auto_picks_the_most_precise_format_that_reaches_the_context(asked, want):
    cfg, card = qwen27b_on(23.5)
    p = plan_for(EngineConfig(model="", profile="C1", kv_dtype="auto", max_context=asked), card, model=cfg)
    assert p.fits and p.kv_dtype == want and p.max_context == asked, p.summary()


def test_auto_refuses_what_no_format_reaches_and_says_what_fits():
    cfg, card = qwen27b_on(23.5)
    p = plan_for(EngineConfig(model="", profile="C8", kv_dtype="auto", max_context=200_000), card, model=cfg)
    assert not p.fits and "C1 with k4v4 KV" in p.message


@pytest.fixture(scope="module")
def ckpt(checkpoint):
    return str(checkpoint("gqa3_ratio3"))


def make(ckpt, **kw):
    return Engine(EngineConfig(model=ckpt, device="cpu", dtype="float32", profile="C1", max_context=1024,
                               prefill_chunk=128, **kw))


@pytest.mark.parametrize("kv", ["k8v4", "k4v4"])
def test_engine_runs_on_4bit_kv_close_to_full_precision(ckpt, kv):
    """Chunked prefill, decode and a prefix hit on 4-bit pools: the logits stay near full precision (bounds from
    the rotated formats' error on this random model; int8's is 2%: test_engine) and a prefix hit scores the same."""
    ids = torch.randint(0, 600, (300,), generator=torch.Generator().manual_seed(31)).tolist()
    full, q = make(ckpt), make(ckpt, kv_dtype=kv)
    try:
        out = q.generate(ids, SamplingParams(max_tokens=12, **GREEDY))
        again = q.generate(ids, SamplingParams(max_tokens=12, **GREEDY))     # the prompt's pages cached: a hit
        assert q.stats()["prefix_hit_tokens"] > 0 and again.token_ids == out.token_ids
        want = full.score(ids + out.token_ids)
        got = q.score(ids + out.token_ids)
    finally:
        full.close()
        q.close()
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < (0.1 if kv == "k8v4" else 0.2), err

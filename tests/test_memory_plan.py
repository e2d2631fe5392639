"""The memory planner on the real 27B shapes with simulated budgets (no weights loaded)."""

import pytest
import torch

from engine.model.config import parse_model_config
from engine.core.memory import GIB, plan_memory
from engine.core.params import EngineConfig
from engine.model.shapes import model_tensor_shapes
from engine.weights.policy import DEFAULT_POLICY, policy_bytes
from engine.bench.random_model import text_config

CFG = parse_model_config(text_config("27b"))
INT4 = policy_bytes(model_tensor_shapes(CFG, with_mtp=False, with_vision=False), DEFAULT_POLICY)["total"]
BF16 = sum(2 * torch.Size(s).numel() for s, _ in model_tensor_shapes(CFG, with_mtp=False, with_vision=False).values())


def plan(budget_gib=24.0, weights=INT4, **fields):
    return plan_memory(CFG, EngineConfig(model="", **fields), torch.bfloat16, weights_bytes=weights,
                       budget_bytes=int(budget_gib * GIB), drafts=0, on_gpu=True)


def test_default_policy_bytes_of_the_27b():
    assert 13.5 * GIB < INT4 < 15.5 * GIB     # int4 linears + int8 embeddings and LM head + 16-bit rest
    assert 50e9 < BF16 < 56e9


def test_24gib_card_holds_32k_bf16_kv_at_c1():
    p = plan(profile="C1", max_context=32768)
    assert p.fits and p.total_bytes <= 24 * GIB, p.summary()


def test_24gib_card_with_int8_kv_reaches_170k_at_c1():
    p = plan(profile="C1", kv_dtype="int8")
    assert p.fits and p.max_context >= 170_000, p.summary()


def test_24gib_card_runs_c8_with_8k_each():
    p = plan(profile="C8", max_context=8192)
    assert p.fits, p.summary()


def test_more_concurrency_means_less_context_each():
    contexts = [plan(profile=c).max_context for c in ("C1", "C2", "C4", "C8")]
    assert contexts == sorted(contexts, reverse=True) and contexts[-1] > 0


def test_bf16_27b_does_not_fit_and_says_why():
    p = plan(weights=BF16)
    assert not p.fits
    assert "Nothing fits" in p.message and "int4" in p.message


def test_too_long_a_context_is_refused_with_what_fits():
    p = plan(profile="C4", max_context=262144)
    assert not p.fits
    assert "What fits" in p.message and "C1 with int8 KV" in p.message


def test_plan_never_exceeds_its_budget_when_it_says_it_fits():
    for budget in (16, 20, 24, 32, 48):
        for profile in ("C1", "C2", "C4", "C8"):
            for kv in ("bf16", "int8"):
                p = plan(budget, profile=profile, kv_dtype=kv)
                if p.fits:
                    assert p.total_bytes <= budget * GIB, (budget, profile, kv, p.summary())


def test_max_context_beyond_the_model_is_an_error():
    with pytest.raises(ValueError, match="exceeds the model"):
        plan(max_context=10**7)


def test_24gib_card_keeps_its_scenarios_with_speculation():
    """The app's default on a GPU: 3 MTP drafts, so the MTP module (0.2 GiB int4), its KV and the rounds' buffers
    are planned too, and the 24 GiB scenarios still fit."""
    with_mtp = policy_bytes(model_tensor_shapes(CFG, with_mtp=True, with_vision=False), DEFAULT_POLICY)["total"]
    assert 0.15 * GIB < with_mtp - INT4 < 0.3 * GIB

    def spec_plan(**fields):
        return plan_memory(CFG, EngineConfig(model="", **fields), torch.bfloat16, weights_bytes=with_mtp,
                           budget_bytes=24 * GIB, drafts=3, on_gpu=True)

    assert spec_plan(profile="C1", max_context=32768).fits
    assert spec_plan(profile="C8", max_context=8192).fits
    p = spec_plan(profile="C1", kv_dtype="int8")
    assert p.fits and p.max_context >= 170_000 and p.drafts == 3 and 0 < p.speculation_bytes < 0.1 * GIB
    assert p.kv_bytes_per_token > plan(profile="C1", kv_dtype="int8").kv_bytes_per_token     # the MTP layer's KV


def test_35b_a3b_on_a_24gib_card_c1_64k_and_c8_8k_each_with_vision_on_demand():
    """The 35B-A3B (config as published: MoE text config, the vision tower, MTP) as the app loads it on a 24 GiB card:
    int4, MTP drafts, the tower on demand (the largest image's encode in the workspace); C1 with at least 64K tokens
    of context and C8 with at least 8K each."""
    from engine.core.device import DeviceInfo
    from engine.core.memory import plan_for
    from engine.bench.random_model import wrapper_config

    cfg = parse_model_config(wrapper_config("35b-a3b"))
    card = DeviceInfo("cuda", "RTX 3090", 24 * GIB, int(23.5 * GIB))
    c1 = plan_for(EngineConfig(model="", profile="C1"), card, model=cfg)
    assert cfg.is_moe and c1.weights == "int4" and c1.vision == "on_demand" and c1.drafts == 3
    assert c1.fits and c1.max_context >= 65536 and c1.total_bytes <= 24 * GIB, c1.summary()
    assert c1.workspace_bytes >= c1.vision_bytes > 0
    c8 = plan_for(EngineConfig(model="", profile="C8"), card, model=cfg)
    assert c8.fits and c8.max_context >= 8192 and c8.total_bytes <= 24 * GIB, c8.summary()
    print("\n35B-A3B, 24 GiB:", c1.summary(), "|", c8.summary())


def test_vision_on_a_24gib_card_is_on_demand_and_keeps_32k_at_c1():
    """The published 27B with its vision tower (config.json as shipped), int4 and MTP as the app loads it: the tower
    stays on the host and borrows the workspace to encode the largest image (16.7 megapixels)."""
    from engine.core.memory import DEFAULT_MAX_PIXELS, plan_for, vision_encode_bytes
    from engine.core.device import DeviceInfo
    from tests.test_quantize import QWEN36_27B

    cfg = parse_model_config(QWEN36_27B)
    card = DeviceInfo("cuda", "RTX 3090", 24 * GIB, int(23.5 * GIB))
    p = plan_for(EngineConfig(model="", profile="C1"), card, model=cfg)
    assert p.weights == "int4" and p.vision == "on_demand" and p.drafts == 3
    assert p.fits and p.max_context >= 32768 and p.total_bytes <= 24 * GIB, p.summary()
    assert p.workspace_bytes >= p.vision_bytes > vision_encode_bytes(cfg, torch.bfloat16, DEFAULT_MAX_PIXELS)
    assert "vision tower on demand" in p.summary()
    resident = plan_for(EngineConfig(model="", profile="C1", vision="resident"), card, model=cfg)
    assert resident.fits and resident.weights_bytes > p.weights_bytes and resident.max_context <= p.max_context
    off = plan_for(EngineConfig(model="", profile="C1", vision="off"), card, model=cfg)
    assert off.vision == "off" and off.vision_bytes == 0 and off.max_context > p.max_context
    big = DeviceInfo("cuda", "H200", 141 * GIB, 140 * GIB)
    assert plan_for(EngineConfig(model="", profile="C1"), big, model=cfg).vision == "resident"
    # a simulated 24 GiB on the big card plans as the small card does
    assert plan_for(EngineConfig(model="", profile="C1", gpu_memory_gb=24), big, model=cfg).vision == "on_demand"
    # no tower in the checkpoint: nothing to place
    assert plan_for(EngineConfig(model="", profile="C1"), card, model=CFG).vision == "off"


@pytest.mark.parametrize("free_gib", [23.5, 22.5])
def test_27b_on_a_desktop_3090_keeps_64k_of_int8_kv_at_c1(free_gib):
    """A 24 GiB card that also drives a display has ~22.5 GiB free (23.5 headless): the published 27B as the app
    loads it there (int4, MTP drafts, the tower on demand) still plans at least 64K tokens of int8 KV at C1, and C8
    8K each with int8 KV; within what is free. (C8 with 8K each of bf16 KV needs ~22.9 GiB: headless cards only.)"""
    from engine.core.device import DeviceInfo
    from engine.core.memory import plan_for
    from tests.test_quantize import QWEN36_27B

    cfg = parse_model_config(QWEN36_27B)
    card = DeviceInfo("cuda", "RTX 3090", 24 * GIB, int(free_gib * GIB))
    c1 = plan_for(EngineConfig(model="", profile="C1", kv_dtype="int8"), card, model=cfg)
    assert c1.weights == "int4" and c1.drafts == 3 and c1.vision == "on_demand", c1.summary()
    assert c1.fits and c1.max_context >= 65536 and c1.total_bytes <= free_gib * GIB, c1.summary()
    c8 = plan_for(EngineConfig(model="", profile="C8", max_context=8192, kv_dtype="int8"), card, model=cfg)
    assert c8.fits and c8.total_bytes <= free_gib * GIB, c8.summary()
    print(f"\n27B, {free_gib} GiB free:", c1.summary())


def test_a_display_costs_context_not_the_plan():
    """A GiB less free (the display's) is a GiB less KV, never a plan that no longer fits."""
    from engine.core.device import DeviceInfo
    from engine.core.memory import plan_for
    from tests.test_quantize import QWEN36_27B

    cfg = parse_model_config(QWEN36_27B)
    plans = [plan_for(EngineConfig(model="", profile="C1", kv_dtype="int8"),
                      DeviceInfo("cuda", "RTX 3090", 24 * GIB, int(free * GIB)), model=cfg) for free in (23.5, 22.5)]
    headless, desktop = plans
    assert headless.weights_bytes == desktop.weights_bytes and headless.workspace_bytes == desktop.workspace_bytes
    assert 0.6 * GIB < headless.kv_bytes - desktop.kv_bytes < GIB

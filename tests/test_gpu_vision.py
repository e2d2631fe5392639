"""GPU: images through the engine on CUDA (tiny vision checkpoint, bf16, Triton kernels): with decode graphs and
speculative round graphs replaying at index + delta, greedy output equals the same engine run eagerly; on demand the
tower's weights are on the GPU only while it encodes."""

import pytest
import torch

from engine.api import Engine, EngineConfig, SamplingParams
from tests.test_vision_engine import SEVERAL

pytestmark = pytest.mark.gpu


def run(path, **kw):
    e = Engine(EngineConfig(model=str(path), device="cuda", max_context=1024, page_size=16, **kw))
    try:
        out = e.generate(SEVERAL, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
        return out, e.plan(), e.stats()
    finally:
        e.close()


def test_graphed_image_chat_equals_eager(checkpoint):
    path = checkpoint("gqa3_ratio3")
    eager, _, _ = run(path, cuda_graphs=False, speculative_tokens=0)
    graphed, plan, stats = run(path, speculative_tokens=0, vision="resident")
    assert graphed.token_ids == eager.token_ids and plan.vision == "resident"
    spec, _, stats = run(path, speculative_tokens=2)
    assert spec.token_ids == eager.token_ids and stats["images_encoded"] == 3


def test_on_demand_tower_leaves_the_gpu_after_encoding(checkpoint):
    e = Engine(EngineConfig(model=str(checkpoint("gqa3_ratio3")), device="cuda", max_context=1024, page_size=16,
                            vision="on_demand", speculative_tokens=0))
    try:
        assert all(p.device.type == "cpu" for p in e._encoder.tower.parameters())
        out = e.generate(SEVERAL, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        assert len(out.token_ids) == 8 and e.plan().vision == "on_demand"
        assert all(p.device.type == "cpu" for p in e._encoder.tower.parameters())
    finally:
        e.close()
    torch.cuda.empty_cache()

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


def test_row_chunks_on_cuda_stay_close_and_the_peak_is_planned(checkpoint, monkeypatch):
    """An image of 4,096 patches through the tower on CUDA as the engine encodes it: its peak under the planner's
    estimate (engine/core/memory.vision_encode_bytes); in chunks of a few hundred patches (cuBLAS picks kernels per row
    count) close to one pass."""
    from engine.model.config import load_model_config
    from engine.core.memory import vision_encode_bytes
    from engine.model.load import load_model
    from engine.vision import tower as tower_module
    from engine.vision.encoder import ImageEncoder
    from engine.vision.processor import ProcessedImage
    from engine.vision.tower import load_vision_tower

    path = checkpoint("gqa3_ratio3")
    cfg = load_model_config(path)
    _, vision = load_model(path, "cuda", torch.bfloat16, mtp=False, vision=True)
    encoder = ImageEncoder(load_vision_tower(cfg.vision, vision, torch.bfloat16, "cuda"), torch.device("cuda"),
                           "resident")
    v = cfg.vision
    pixels = torch.randn(64 * 64, 3 * v.temporal_patch_size * v.patch_size ** 2,
                         generator=torch.Generator().manual_seed(0))
    image = ProcessedImage(pixels, (1, 64, 64), 64 * 64 // v.spatial_merge_size ** 2, b"test")
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    whole = encoder.encode(image).float()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= vision_encode_bytes(cfg, torch.bfloat16, 64 * 64 * v.patch_size ** 2), peak
    monkeypatch.setattr(tower_module, "CHUNK_ROWS", 500)
    chunked = encoder.encode(image).float()
    assert ((chunked - whole).abs().max() / whole.abs().max()).item() < 2e-2

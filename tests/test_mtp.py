"""The MTP module loads from `mtp.*` and computes what its definition says (no transformers reference
exists for it: checked against the plain-torch restatement of the published design in tests/mtp_distill.py)."""

import torch
from safetensors.torch import load_file

from engine.cache.pages import CacheTensors
from engine.model.load import load_model
from engine.model.batch import build_batch
from tests.mtp_distill import mtp_restated


def test_mtp_matches_restatement(checkpoint):
    path = checkpoint("base")
    model, _ = load_model(path, "cpu", torch.float32, mtp=True)
    assert model.mtp is not None
    cfg = model.cfg
    tensors = {k: v.float() for k, v in load_file(path / "model.safetensors").items()}
    T = 24
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(T, cfg.hidden_size, generator=gen)
    next_ids = torch.randint(0, cfg.vocab_size, (T,), generator=gen)
    pools = CacheTensors.allocate(cfg, 4, 16, 1, torch.float32, "cpu", mtp_layers=1)
    batch = build_batch([T], [0], [0], [[0, 1]], 16, "cpu", last_only=False)
    with torch.no_grad():
        ours = model.logits(model.mtp_forward(next_ids, hidden, batch, pools))
    ref = mtp_restated(tensors, cfg, tensors["model.embed_tokens.weight"], hidden, next_ids, tensors["lm_head.weight"])
    assert ours.shape == (T, cfg.vocab_size) and torch.isfinite(ours).all()
    assert ((ours - ref).abs().max() / ref.abs().max()).item() < 1e-4

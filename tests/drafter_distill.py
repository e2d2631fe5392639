"""A small self-distillation that fits a tiny block drafter to a tiny checkpoint's own greedy continuations, from the
target's tapped features as the engine's forward makes them, so that tests can draft with a drafter that predicts."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.fixtures.drafters import write_drafter
from tests.mtp_distill import _sequences


def _features(model, drafter_cls, cfg, ids: list[int]) -> torch.Tensor:
    """The target's tapped features [T, len(taps) x H] over one sequence, as Qwen3_5Model.forward hands them to a
    drafter."""
    from engine.cache.pages import CacheTensors
    from engine.model.batch import build_batch

    class Recorder(drafter_cls):
        def write_context(self, features, positions, slots, ring_slots, pools):
            self.recorded = features

    recorder = Recorder(cfg)
    model.attach_drafter(recorder)
    T, page = len(ids), 16
    pages = list(range(-(-T // page)))
    pools = CacheTensors.allocate(model.cfg, len(pages), page, 1, torch.float32, "cpu")
    with torch.no_grad():
        model(torch.tensor(ids), build_batch([T], [0], [0], [pages], page, "cpu", last_only=False), pools)
    model.drafter = None
    return recorder.recorded


def distill_drafter(target: str, dst: Path, variant: str = "dflash", steps: int = 80, lr: float = 3e-3) -> Path:
    """A drafter checkpoint for `target` in `dst` (write_drafter's config: 6-row blocks), fitted (Adam) to draft the
    target's greedy continuations of 12 prompts from its tapped features: every anchor past the prompt, each step."""
    from engine.model.dflash import Drafter
    from engine.model.drafter_config import parse_drafter_config
    from engine.model.load import load_model

    seqs = _sequences(target, n=12, prompt_len=16, new=48)
    model, _ = load_model(target, "cpu", torch.float32)
    path = write_drafter(dst, target, variant, head_dim=32)
    cfg = parse_drafter_config(json.loads((path / "config.json").read_text()))
    feats = [_features(model, Drafter, cfg, s) for s in seqs]
    torch.manual_seed(0)
    drafter = Drafter(cfg)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif "codebook" in name or "base_kernel" in name:
                p.normal_(0, 0.02)
    embed, head = model.embed.weight.detach(), model.lm_head.weight.detach()
    B, L = cfg.block_size, len(seqs[0])
    anchors = torch.arange(16, L - B)
    ids = torch.tensor(seqs)                                                     # [N, L]
    N, A = len(seqs), len(anchors)
    # every anchor's block of a sequence at once: its rows (A x B) over keys = the sequence's context, then the blocks
    row_anchor = anchors.repeat_interleave(B)
    row_pos = (anchors[:, None] + torch.arange(B)).reshape(-1)
    row_block = torch.arange(A).repeat_interleave(B)
    key_pos = torch.cat([torch.arange(L), row_pos])
    in_block = torch.cat([torch.full((L,), -1), row_block])

    def mask(layer) -> torch.Tensor:
        context = (in_block[None] < 0) & (key_pos[None] < row_anchor[:, None])
        visible = context | (in_block[None] == row_block[:, None])
        if layer.causal:
            visible &= key_pos[None] <= row_pos[:, None]
        if layer.window is not None:
            visible &= (row_pos[:, None] - key_pos[None]).abs() < layer.window
        return visible

    masks = [mask(layer) for layer in drafter.layers]
    block = embed[torch.stack([ids[:, anchors], torch.full((N, A), cfg.mask_token_id)], -1)[..., [0] + [1] * (B - 1)]]
    labels = torch.stack([ids[:, anchors + j] for j in range(1, B)], -1).reshape(-1)
    feats = torch.cat(feats)
    opt = torch.optim.Adam(drafter.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        ctx = drafter.context(feats)
        x = block.reshape(-1, block.shape[-1])
        for layer, visible in zip(drafter.layers, masks):
            k_ctx, v_ctx = layer.self_attn.kv(ctx, torch.arange(L).repeat(N))

            def attend(q, k, v, k_ctx=k_ctx, v_ctx=v_ctx, visible=visible):
                keys = torch.cat([k_ctx.view(N, L, *k.shape[1:]), k.view(N, A * B, *k.shape[1:])], 1)
                values = torch.cat([v_ctx.view(N, L, *v.shape[1:]), v.view(N, A * B, *v.shape[1:])], 1)
                groups = q.shape[1] // keys.shape[2]
                keys, values = keys.repeat_interleave(groups, 2), values.repeat_interleave(groups, 2)
                out = F.scaled_dot_product_attention(q.view(N, A * B, *q.shape[1:]).transpose(1, 2),
                                                     keys.transpose(1, 2), values.transpose(1, 2), attn_mask=visible)
                return out.transpose(1, 2).reshape(q.shape)
            x = layer(x, row_pos.repeat(N), attend, B)
        hidden = drafter.norm(x).view(N * A, B, -1)[:, 1:]
        logits = drafter.logits(hidden, lambda h: h @ head.T).reshape(-1, head.shape[0])
        F.cross_entropy(logits, labels).backward()
        opt.step()
    return write_drafter(dst, target, variant, state=drafter.state_dict(), head_dim=32)

"""The MTP module loads from `mtp.*` and computes what its definition says (no transformers reference
exists for it: checked against a plain-torch restatement written here from the published design)."""

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from engine.kv_cache import CacheTensors
from engine.model import load_model
from engine.model.batch import build_batch


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def rope(x, pos, rot, theta):
    inv = 1.0 / theta ** (torch.arange(0, rot, 2).float() / rot)
    ang = pos[:, None].float() * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    xr, rest = x[..., :rot], x[..., rot:]
    rotated = torch.cat([-xr[..., rot // 2:], xr[..., :rot // 2]], -1)
    return torch.cat([xr * cos + rotated * sin, rest], -1)


def mtp_restated(t, cfg, embed, hidden, next_ids, lm_head):
    p = "mtp.layers.0."
    x = torch.cat([rms(embed[next_ids], t["mtp.pre_fc_norm_embedding.weight"]),
                   rms(hidden, t["mtp.pre_fc_norm_hidden.weight"])], -1) @ t["mtp.fc.weight"].T
    T, H, KV, D = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = rms(x, t[p + "input_layernorm.weight"])
    qg = (h @ t[p + "self_attn.q_proj.weight"].T).view(T, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(T, H * D)
    k = (h @ t[p + "self_attn.k_proj.weight"].T).view(T, KV, D)
    v = (h @ t[p + "self_attn.v_proj.weight"].T).view(T, KV, D)
    pos = torch.arange(T)
    q = rope(rms(q, t[p + "self_attn.q_norm.weight"]), pos, cfg.rotary_dim, cfg.rope_theta)
    k = rope(rms(k, t[p + "self_attn.k_norm.weight"]), pos, cfg.rotary_dim, cfg.rope_theta)
    k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    o = (att.transpose(0, 1).reshape(T, H * D) * torch.sigmoid(gate)) @ t[p + "self_attn.o_proj.weight"].T
    x = x + o
    h = rms(x, t[p + "post_attention_layernorm.weight"])
    mlp = (F.silu(h @ t[p + "mlp.gate_proj.weight"].T) * (h @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    return rms(x + mlp, t["mtp.norm.weight"]) @ lm_head.T


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

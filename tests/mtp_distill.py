"""The MTP module restated in plain torch from the published Qwen3.5 design (tests/test_mtp.py checks ours against
it), and a small self-distillation that fits a tiny checkpoint's MTP weights to its own model, so that tests can
speculate with a head that predicts."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

P = "mtp.layers.0."
TRAINED = ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
           P + "input_layernorm.weight", P + "post_attention_layernorm.weight", P + "self_attn.q_proj.weight",
           P + "self_attn.k_proj.weight", P + "self_attn.v_proj.weight", P + "self_attn.o_proj.weight",
           P + "self_attn.q_norm.weight", P + "self_attn.k_norm.weight", P + "mlp.gate_proj.weight",
           P + "mlp.up_proj.weight", P + "mlp.down_proj.weight")


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
    """Logits of the MTP module over sequences' positions ([T] or [N, T] ids, hidden [..., T, H]): position i takes
    the token after it (next_ids) and the main model's hidden state there; causal attention over the positions
    before."""
    x = torch.cat([rms(embed[next_ids], t["mtp.pre_fc_norm_embedding.weight"]),
                   rms(hidden, t["mtp.pre_fc_norm_hidden.weight"])], -1) @ t["mtp.fc.weight"].T
    *lead, T, _ = x.shape
    H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = rms(x, t[P + "input_layernorm.weight"])
    qg = (h @ t[P + "self_attn.q_proj.weight"].T).view(*lead, T, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:].reshape(*lead, T, H * D)
    k = (h @ t[P + "self_attn.k_proj.weight"].T).view(*lead, T, KV, D)
    v = (h @ t[P + "self_attn.v_proj.weight"].T).view(*lead, T, KV, D)
    pos = torch.arange(T)
    q = rope(rms(q, t[P + "self_attn.q_norm.weight"]), pos, cfg.rotary_dim, cfg.rope_theta)
    k = rope(rms(k, t[P + "self_attn.k_norm.weight"]), pos, cfg.rotary_dim, cfg.rope_theta)
    k, v = k.repeat_interleave(H // KV, -2), v.repeat_interleave(H // KV, -2)
    att = F.scaled_dot_product_attention(q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2),
                                         is_causal=True)
    o = (att.transpose(-3, -2).reshape(*lead, T, H * D) * torch.sigmoid(gate)) @ t[P + "self_attn.o_proj.weight"].T
    x = x + o
    h = rms(x, t[P + "post_attention_layernorm.weight"])
    mlp = (F.silu(h @ t[P + "mlp.gate_proj.weight"].T) * (h @ t[P + "mlp.up_proj.weight"].T)) \
        @ t[P + "mlp.down_proj.weight"].T
    return rms(x + mlp, t["mtp.norm.weight"]) @ lm_head.T


def _sequences(path: str, n: int, prompt_len: int, new: int) -> list[list[int]]:
    """n prompts of random ids with their plain greedy continuations."""
    from engine.api import Engine, EngineConfig, SamplingParams

    gen = torch.Generator().manual_seed(0)
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_context=512, speculative_tokens=0)) as e:
        out = []
        for _ in range(n):
            ids = torch.randint(0, 600, (prompt_len,), generator=gen).tolist()
            params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
            out.append(ids + e.generate(ids, params).token_ids)
    return out


@torch.no_grad()
def _hidden(model, ids: list[int]) -> torch.Tensor:
    """The main model's final hidden states over one sequence [T, H]."""
    from engine.cache.pages import CacheTensors
    from engine.model.batch import build_batch

    T, page = len(ids), 16
    pages = list(range(-(-T // page)))
    pools = CacheTensors.allocate(model.cfg, len(pages), page, 1, torch.float32, "cpu", mtp_layers=1)
    batch = build_batch([T], [0], [0], [pages], page, "cpu", last_only=False)
    return model(torch.tensor(ids), batch, pools)


def distill_mtp(src: str, dst: Path, steps: int = 300, lr: float = 3e-3) -> Path:
    """A copy of the checkpoint at `src` whose MTP module was fitted (Adam, full batch) to predict the model's own
    greedy token after next from its hidden states."""
    from engine.model.load import load_model

    seqs = _sequences(src, n=12, prompt_len=16, new=48)
    model, _ = load_model(src, "cpu", torch.float32, mtp=True)
    ids = torch.tensor(seqs)                                                    # [N, T]: equal lengths
    hidden = torch.stack([_hidden(model, s) for s in seqs])
    file = Path(src) / "model.safetensors"
    tensors = load_file(file)
    t = {k: v.float() for k, v in tensors.items()}
    for name in TRAINED:
        t[name] = t[name].clone().requires_grad_(True)
    embed, head = t["model.embed_tokens.weight"], t.get("lm_head.weight", t["model.embed_tokens.weight"])
    opt = torch.optim.Adam([t[n] for n in TRAINED], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        logits = mtp_restated(t, model.cfg, embed, hidden[:, :-2], ids[:, 1:-1], head)
        F.cross_entropy(logits.flatten(0, 1), ids[:, 2:].flatten()).backward()
        opt.step()
    shutil.copytree(src, dst)
    out = {k: (t[k].detach().to(v.dtype) if k in TRAINED else v) for k, v in tensors.items()}
    save_file(out, str(Path(dst) / "model.safetensors"), metadata={"format": "pt"})
    return Path(dst)

"""The block drafter as the engine runs it: the checkpoint's layers (engine/model/dflash.py Drafter, the reference) in
the engine's layout, so that a block's forward is a few fused launches a layer instead of dozens of torch ops.

- Each layer's k | v | q projections are one weight (k | v first: the context writes read only those rows), gate | up
  another (SwiGLU in the int4 GEMV's epilogue); quantized as the target's of the same kind (the policy, by checkpoint
  name).
- The Qwen3 norms (x / rms(x) * w) are held as w - 1 in fp32, so the engine's zero-centred norm kernels ((1 + w'))
  apply them: one launch a norm, the residual add fused in, the q / k head norms fused with the rotary embedding.
- Attention runs the paged decode kernel once per block (qwendesk_kernels/attention.block_attention): the block's
  rows are the last rows of their sequence, seeing the whole block (full layers) or the rows up to themselves
  within the sliding window; each key is read once per block, whatever the context.
- Its checkpoint loads through the model's loader (engine/weights/loader.py): its int4 conversion is cached on disk as
  the model's is, so only the first load converts.

Where the context K / V live and who writes them: engine/model/dflash.py's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.model.batch import ForwardBatch
from engine.model.config import ModelConfig
from engine.model.dflash import CandidateSelector, DynamicCausalConv, draft_logits
from engine.model.drafter_config import DrafterConfig, DrafterMismatch, check_drafter, read_drafter_config
from engine.model.layers import MLP, RMSNorm
from engine.model.linear import Build, Linear
from engine.weights.checkpoint import CheckpointError
from engine.weights.loader import load_state_dict, load_weights
from qwendesk_kernels import ops
from qwendesk_kernels.rope import inv_freq


@dataclass
class DraftBlocks:
    """Where N blocks of `block` rows sit: each block is the last `block` rows of its sequence's keys."""
    tables: torch.Tensor         # [N, max_pages] int32 each sequence's page table
    seq_lens: torch.Tensor       # [N] int32 base + block; fewer (the keys that have pages, at least 1) at the end of
                                 # a sequence's room, where the rows' masks then shift: only their drafts can suffer
    slots: torch.Tensor          # [N * block] int64 KV slot of each row (-1: none)
    block: int
    max_seq_len: int
    ring_tables: torch.Tensor | None = None   # [N, max_pages] int32 each sequence's ring as pages (ring_table)
    ring_slots: torch.Tensor | None = None    # [N * block] int64 ring slot of each row (ring_slots; -1: none)


def ring_slots(state_slots: torch.Tensor, positions: torch.Tensor, kv_slots: torch.Tensor, ring: int) -> torch.Tensor:
    """Flat ring slot of rows at token `positions` of sequences in `state_slots` (per row): slot x ring + position mod
    ring; -1 where the row's KV slot is -1 (it is written nowhere)."""
    return torch.where(kv_slots >= 0, state_slots * ring + positions % ring, -1)


def ring_table(state_slots: torch.Tensor, width: int, ring: int, page_size: int) -> torch.Tensor:
    """[N, width] int32: each sequence's ring read as pages (CacheTensors.drafter_layer), so that the paged attention
    kernels read it: entry i is page i mod (ring / page_size) of its slot's ring. A window's keys (the only ones a
    ring layer's rows see) never wrap onto each other, since a ring holds a window and a block."""
    pages = ring // page_size
    return (state_slots[:, None] * pages + torch.arange(width, device=state_slots.device) % pages).int()


def step_ring_slots(batch: ForwardBatch, ring: int) -> torch.Tensor:
    """Ring slots of a forward's rows [T] (on the device, no host sync): a row more than `ring` rows before the end of
    its sequence's rows in the step writes nothing (a later row of the step takes its slot)."""
    ends = batch.cu_seqlens[1:]
    rows = torch.arange(batch.slot_mapping.shape[0], dtype=ends.dtype, device=ends.device)
    seq = torch.searchsorted(ends, rows, right=True)
    after = ends[seq] - 1 - rows                       # the sequence's rows after this one in the step
    positions = (batch.seq_lens[seq] - 1 - after).long()
    slots = ring_slots(batch.state_slots[seq], positions, batch.slot_mapping, ring)
    return torch.where(after < ring, slots, -1)


class BlockAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig, index: int, build: Build, norms: Build):
        super().__init__()
        h, d, prefix = cfg.hidden_size, cfg.head_dim, f"layers.{index}.self_attn."
        self.heads, self.kv_heads, self.head_dim, self.eps = cfg.num_heads, cfg.num_kv_heads, d, cfg.rms_norm_eps
        self.causal, self.window = cfg.causal(index), cfg.window(index) or 0
        self.ring = cfg.ring_layers[index]               # its context is in the state slots' rings, not in pages
        kv = cfg.num_kv_heads * d
        self.kvq = Linear(h, {"k_proj": kv, "v_proj": kv, "q_proj": cfg.num_heads * d}, build, prefix)
        self.o_proj = Linear(cfg.num_heads * d, {"o_proj": h}, build, prefix)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, norms)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, norms)

    def context(self, ctx: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, pools, rope) -> None:
        """The K / V of context rows ctx [T, H] (roped at `positions`) into this layer's pools at `slots`."""
        T, n = ctx.shape[0], self.kv_heads * self.head_dim
        k, v = self.kvq.first_rows(ctx, 2 * n).split([n, n], -1)
        k, v = k.view(T, self.kv_heads, self.head_dim), v.view(T, self.kv_heads, self.head_dim)
        ops.qk_norm_rope(k[:, :0], k, self.k_norm.weight, self.k_norm.weight, self.eps, positions, *rope)  # no q
        kc, vc, ks, vs = pools
        ops.store_kv(k, v, kc, vc, slots, k_scale=ks, v_scale=vs)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, blocks: DraftBlocks, pools, rope) -> torch.Tensor:
        """Rows x [N * block, H] -> the attention's output projection [N * block, H]; the rows' own K / V are written
        at their slots (past the committed tokens: the verify that follows writes over them)."""
        T, n = x.shape[0], self.kv_heads * self.head_dim
        k, v, q = self.kvq(x).split([n, n, self.heads * self.head_dim], -1)
        q = q.view(T, self.heads, self.head_dim)
        k, v = k.view(T, self.kv_heads, self.head_dim), v.view(T, self.kv_heads, self.head_dim)
        ops.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, self.eps, positions, *rope)
        kc, vc, ks, vs = pools
        tables, slots = (blocks.ring_tables, blocks.ring_slots) if self.ring else (blocks.tables, blocks.slots)
        assert tables is not None and slots is not None, "a ring layer's block needs ring tables and slots"
        ops.store_kv(k, v, kc, vc, slots, k_scale=ks, v_scale=vs)
        o = ops.block_attention(q, kc, vc, tables, blocks.seq_lens, self.head_dim ** -0.5, blocks.block,
                                causal=self.causal, window=self.window, k_scale=ks, v_scale=vs,
                                max_seq_len=blocks.max_seq_len)
        return self.o_proj(o.view(T, -1))


def _conv(cfg: DrafterConfig, build: Build, prefix: str) -> DynamicCausalConv:
    """DFlash2's convolution with its kernel projection held as the policy says."""
    h = cfg.hidden_size
    projection = Linear(h, {"kernel_projection": 2 * cfg.conv_kernel * (h // cfg.conv_group)}, build, prefix)
    return DynamicCausalConv(h, cfg.conv_kernel, cfg.conv_group, projection, build.empty(2, cfg.conv_kernel, h))


class BlockDrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, index: int, build: Build, norms: Build):
        super().__init__()
        prefix = f"layers.{index}."
        self.self_attn = BlockAttention(cfg, index, build, norms)
        self.mlp = MLP(cfg, build, prefix + "mlp.")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, norms)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, norms)
        dflash2 = cfg.variant == "dflash2"
        self.attention_conv = _conv(cfg, build, prefix + "attention_conv.") if dflash2 else None
        self.mlp_conv = _conv(cfg, build, prefix + "mlp_conv.") if dflash2 else None

    def forward(self, x, residual, positions, blocks: DraftBlocks, pools, rope):
        """(x, residual) as the target's DecoderLayer passes them: the sum is the residual stream."""
        h, residual = self.input_layernorm.add_forward(x, residual)
        if self.attention_conv is not None:
            h, kernel = self.attention_conv.prepare(h, blocks.block)
            h = self.attention_conv.finish(self.self_attn(h, positions, blocks, pools, rope), kernel, blocks.block)
        else:
            h = self.self_attn(h, positions, blocks, pools, rope)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        if self.mlp_conv is not None:
            h, kernel = self.mlp_conv.prepare(h, blocks.block)
            return self.mlp_conv.finish(self.mlp(h), kernel, blocks.block), residual
        return self.mlp(h), residual


class BlockDrafter(nn.Module):
    """A DFlash / DFlash2 drafter in the engine's layout (see the module docstring): `load_drafter` fills it."""

    def __init__(self, cfg: DrafterConfig, build: Build):
        super().__init__()
        self.cfg = cfg
        norms = Build(torch.float32, build.device)                # w - 1 of a bf16 w is exact in fp32, not in bf16
        h = cfg.hidden_size
        self.fc = Linear(len(cfg.target_layer_ids) * h, {"fc": h}, build, "")
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps, norms)
        self.layers = nn.ModuleList(BlockDrafterLayer(cfg, i, build, norms) for i in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps, norms)
        selector = None
        if cfg.variant == "dflash2":
            projection = Linear(h, {"hidden_projection": cfg.selector_rank}, build, "candidate_selector.")
            selector = CandidateSelector(cfg, projection, build.empty(cfg.vocab_size, cfg.selector_rank),
                                         build.empty(cfg.vocab_size, cfg.selector_rank))
        self.candidate_selector = selector
        self.taps = {layer: i for i, layer in enumerate(cfg.target_layer_ids)}   # target layer -> its slice of fc
        self.register_buffer("freqs", inv_freq(cfg.head_dim, cfg.rope_theta, build.device), persistent=False)
        self.register_buffer("axis", torch.zeros(cfg.head_dim // 2, dtype=torch.int64, device=build.device),
                             persistent=False)

    def checkpoint_slices(self):
        """(checkpoint name, target, first row, checkpoint shape) of every weight, as Qwen3_5Model's (the loader in
        engine/weights/loader.py fills them; then `centre_norms_`)."""
        for path, module in self.named_modules():
            if isinstance(module, Linear):
                yield from module.checkpoint_slices()
            elif isinstance(module, RMSNorm):
                yield f"{path}.weight", module.weight, 0, tuple(module.weight.shape)
            elif isinstance(module, (DynamicCausalConv, CandidateSelector)):
                for name, p in module.named_parameters(recurse=False):
                    yield f"{path}.{name}", p, 0, tuple(p.shape)

    @torch.no_grad()
    def centre_norms_(self) -> None:
        """The norm weights as loaded (the checkpoint's w) -> w - 1, what the engine's kernels take."""
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.sub_(1)

    @property
    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.freqs, self.axis

    def write_context(self, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      ring_slots: torch.Tensor | None, pools) -> None:
        """The context K / V of rows the target just computed (features [T, len(taps) x H] at rotary `positions` [T])
        into the drafter's pages at their KV `slots` [T] and, for its sliding-window layers, into their sequences'
        rings at `ring_slots` [T] (step_ring_slots; None: no ring layer); -1: written nowhere. pools: CacheTensors."""
        ctx = self.hidden_norm(self.fc(features))
        for i, layer in enumerate(self.layers):
            where = ring_slots if layer.self_attn.ring else slots
            assert where is not None, "a ring layer's context needs ring slots"
            layer.self_attn.context(ctx, positions, where, pools.drafter_layer(i), self.rope)

    def draft(self, x: torch.Tensor, positions: torch.Tensor, blocks: DraftBlocks, pools) -> torch.Tensor:
        """N blocks at once: x [N * B, H] the target's embeddings of each [anchor, MASK x (B - 1)] (times
        embedding_scale) at rotary `positions` [N * B], over the context in `pools`' pages; -> final-normed hidden
        states [N * B, H]."""
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, positions, blocks, pools.drafter_layer(i), self.rope)
        return self.norm.add_forward(x, residual)[0]

    def logits(self, hidden: torch.Tensor, head) -> torch.Tensor:
        return draft_logits(self.cfg, hidden, head)


def load_drafter(path, target: ModelConfig, device="cpu", dtype: torch.dtype = torch.bfloat16, policy=None,
                 progress=None) -> BlockDrafter:
    """The drafter checkpoint at `path` for `target`, in the engine's layout on `device` (refused in one line,
    DrafterMismatch, when it was made for another model or its tensors are not its config's). policy: the target's
    quantization policy (engine/weights/policy.py), which the drafter's projections take too (None: all `dtype`);
    their conversion is cached on disk as the model's is. progress(stage, done, total): as load_weights'."""
    cfg = read_drafter_config(path)
    check_drafter(cfg, target)
    drafter = BlockDrafter(cfg, Build(dtype, device, policy))
    try:
        load_weights(drafter, path, device, keep_vision=False, policy=policy, progress=progress)
    except CheckpointError as e:
        raise DrafterMismatch(f"the drafter checkpoint: {e}") from None
    drafter.centre_norms_()
    return drafter.eval()


def drafter_from_state(cfg: DrafterConfig, build: Build, state: dict[str, torch.Tensor]) -> BlockDrafter:
    """A drafter in the engine's layout from checkpoint-named tensors in memory (a reference Drafter's state_dict:
    the tests); 16-bit builds only (a quantized one loads from a folder)."""
    drafter = BlockDrafter(cfg, build)
    load_state_dict(drafter, state)
    drafter.centre_norms_()
    return drafter.eval()

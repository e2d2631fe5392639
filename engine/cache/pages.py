"""Cache memory: the paged KV pool of the full-attention layers and the GDN state slots.

Full-attention layers keep K/V in fixed-size pages ([num_pages, page_size, Hkv, D] per layer);
a sequence owns a list of pages (its page table). Gated DeltaNet layers keep a fixed-size state
per sequence (conv window [W-1, C] and recurrent state [Hv, K, V] fp32) in numbered slots.
These tensors are passed around as `pools`; what holds which page and slot is the cache
(engine.cache.manager.CacheManager).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch

from engine.cache.kv_format import KVFormat
from engine.model.config import ModelConfig
from engine.model.drafter_config import DrafterConfig


class PageTable(array):
    """A sequence's KV pages in order: int32 in one block of memory, so that a step copies it to the GPU in one go
    whatever its length (engine/model/batch.py page_table); equal to a list of the same pages."""

    def __new__(cls, pages=()):
        return super().__new__(cls, "i", pages)

    def __eq__(self, other) -> bool:
        return list(self) == list(other)


def _pools(lead: tuple[int, ...], layouts, device) -> list[torch.Tensor | None]:
    """K, V (zeros) and their scales (ones; None where 16-bit) of shape `lead` + each layout's (KVFormat.layouts)."""
    return [None if spec is None else (torch.zeros if i < 2 else torch.ones)(lead + spec[0], dtype=spec[1],
                                                                             device=device)
            for i, spec in enumerate(layouts)]


@dataclass
class CacheTensors:
    """Layer-stacked pools; index [layer] gives one layer's contiguous view.
    Slots hold live sequences' GDN state and, above them, prefix-reuse snapshots of it (engine.cache.snapshots)."""
    k: torch.Tensor             # [n_attn, num_pages, page_size, Hkv, D] (MTP layers last)
    v: torch.Tensor
    k_scale: torch.Tensor | None  # quantized KV's scales (KVFormat.layouts; int8: [n_attn, pages, page_size, Hkv] fp32)
    v_scale: torch.Tensor | None
    conv: torch.Tensor          # [n_gdn, num_slots, W-1, conv_dim]
    ssm: torch.Tensor           # [n_gdn, num_slots, Hv, K, V] fp32
    page_size: int
    # A block drafter's context K / V (engine/model/dflash.py) in the format KVFormat.drafter says (int8: with fp32
    # scales per token and head). Its full-attention layers' are paged with the sequence, at the model's pages:
    draft_k: torch.Tensor | None = None          # [n_paged, num_pages, page_size, Hkv, D]
    draft_v: torch.Tensor | None = None
    draft_k_scale: torch.Tensor | None = None
    draft_v_scale: torch.Tensor | None = None
    # its sliding-window layers' in a ring per state slot (the window's keys: DrafterConfig.ring_tokens), part of the
    # slot's state, so snapshots, prefix hits and the cache tiers carry them as they carry the GDN state:
    ring_k: torch.Tensor | None = None           # [n_ring, num_slots, ring_tokens, Hkv, D]
    ring_v: torch.Tensor | None = None
    ring_k_scale: torch.Tensor | None = None
    ring_v_scale: torch.Tensor | None = None
    draft_rings: tuple[bool, ...] = ()           # per drafter layer: its context is in a ring (else paged)
    draft_window: int = 0                        # the ring layers' window

    @staticmethod
    def allocate(cfg: ModelConfig, num_pages: int, page_size: int, num_slots: int,
                 dtype: torch.dtype, device, mtp_layers: int = 0, kv: KVFormat = KVFormat.BF16,
                 drafter: DrafterConfig | None = None) -> CacheTensors:
        """drafter: a block drafter whose context K / V live in these pools."""
        n_attn = len(cfg.full_attention_layers) + mtp_layers
        n_gdn = len(cfg.linear_attention_layers)
        k, v, k_scale, v_scale = _pools((n_attn, num_pages, page_size, cfg.num_kv_heads), kv.layouts(cfg.head_dim,
                                                                                                     dtype), device)
        paged: list[torch.Tensor | None] = [None] * 4
        rings: list[torch.Tensor | None] = [None] * 4
        drafter_kw: dict = {}
        if drafter is not None:
            layouts, heads, ring = kv.drafter.layouts(drafter.head_dim, dtype), drafter.num_kv_heads, \
                drafter.ring_tokens(page_size)
            n_ring = drafter.ring_layers.count(True)
            if n_ring < drafter.num_layers:
                paged = _pools((drafter.num_layers - n_ring, num_pages, page_size, heads), layouts, device)
            if n_ring:
                rings = _pools((n_ring, num_slots, ring, heads), layouts, device)
            drafter_kw = dict(draft_rings=drafter.ring_layers, draft_window=drafter.sliding_window or 0)
        return CacheTensors(
            k=k,
            v=v,
            k_scale=k_scale,
            v_scale=v_scale,
            conv=torch.zeros(n_gdn, num_slots, cfg.conv_kernel - 1, cfg.conv_dim, dtype=dtype, device=device),
            ssm=torch.zeros(n_gdn, num_slots, cfg.linear_num_v_heads, cfg.linear_k_head_dim,
                            cfg.linear_v_head_dim, dtype=torch.float32, device=device),
            page_size=page_size,
            draft_k=paged[0], draft_v=paged[1], draft_k_scale=paged[2], draft_v_scale=paged[3],
            ring_k=rings[0], ring_v=rings[1], ring_k_scale=rings[2], ring_v_scale=rings[3],
            **drafter_kw,
        )

    def attention_layer(self, i: int) -> tuple:
        """(k, v, k_scale, v_scale) pools of full-attention layer i."""
        ks = self.k_scale[i] if self.k_scale is not None else None
        vs = self.v_scale[i] if self.v_scale is not None else None
        return self.k[i], self.v[i], ks, vs

    def drafter_layer(self, i: int) -> tuple:
        """(k, v, k_scale, v_scale) pools of block drafter layer i (scales None when 16-bit), as pages: a ring layer's
        rings read as num_slots x ring_tokens / page_size pages (slot s's ring is pages s x that ..)."""
        assert self.draft_rings, "the pools hold no block drafter's KV"
        ring = self.draft_rings[i]
        j = self.draft_rings[:i].count(ring)
        parts = (self.ring_k, self.ring_v, self.ring_k_scale, self.ring_v_scale) if ring else \
            (self.draft_k, self.draft_v, self.draft_k_scale, self.draft_v_scale)
        if not ring:
            return tuple(None if t is None else t[j] for t in parts)
        return tuple(None if t is None else t[j].view(-1, self.page_size, *t.shape[3:]) for t in parts)

    @property
    def ring_tokens(self) -> int:
        """Tokens a drafter's ring holds (0: no ring)."""
        return 0 if self.ring_k is None else self.ring_k.shape[2]

    @property
    def snapshot_tail(self) -> int | None:
        """The most rows a prefill step may compute past a prefix snapshot it takes in passing, so that the rings
        (copied after the step) still hold the window before the snapshot (None: no ring, no limit)."""
        return self.ring_tokens - self.draft_window + 1 if self.ring_k is not None else None

    def gdn_layer(self, i: int) -> tuple:
        """(conv, recurrent) state pools of GDN layer i."""
        return self.conv[i], self.ssm[i]

    @property
    def num_pages(self) -> int:
        return self.k.shape[1]

    @property
    def num_slots(self) -> int:
        return self.conv.shape[1]

    @property
    def scratch_slot(self) -> int:
        """The slot that padding rows of graphed batches write to (and nothing reads): the last one."""
        return self.num_slots - 1

    def copy_state(self, src: int, dst: int) -> None:
        """Copy one slot's state (every GDN layer's, a drafter's rings) into another slot."""
        for t in self._state_parts():
            t[:, dst].copy_(t[:, src])

    def copy_rings(self, src: int, dst: int) -> None:
        """Copy one slot's drafter rings (if any) into another slot: a snapshot whose GDN state a kernel wrote."""
        for t in self._ring_parts():
            t[:, dst].copy_(t[:, src])

    # ---- pages and states as bytes: what the host and disk tiers store --------------------------
    def _page_parts(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v, self.k_scale, self.v_scale, self.draft_k, self.draft_v, self.draft_k_scale,
                            self.draft_v_scale) if t is not None]

    def _ring_parts(self) -> list[torch.Tensor]:
        return [t for t in (self.ring_k, self.ring_v, self.ring_k_scale, self.ring_v_scale) if t is not None]

    def _state_parts(self) -> list[torch.Tensor]:
        return [self.conv, self.ssm, *self._ring_parts()]

    @property
    def page_nbytes(self) -> int:
        """Bytes of one page: K and V of every attention layer (and their scales; a block drafter's K and V)."""
        return sum(t[:, 0].numel() * t.element_size() for t in self._page_parts())

    @property
    def state_nbytes(self) -> int:
        """Bytes of one slot's state (conv window and recurrent state of every GDN layer, a drafter's rings)."""
        return sum(t[:, 0].numel() * t.element_size() for t in self._state_parts())

    def read_pages(self, pages: list[int]) -> torch.Tensor:
        """Pages as bytes, [len(pages), page_nbytes] uint8 on the pools' device (a gather: a new tensor)."""
        idx = torch.tensor(pages, dtype=torch.long, device=self.k.device)
        return torch.cat([t.index_select(1, idx).transpose(0, 1).reshape(len(pages), -1).view(torch.uint8)
                          for t in self._page_parts()], dim=1)

    def write_pages(self, pages: list[int], data: torch.Tensor) -> None:
        """Inverse of read_pages: `data` [len(pages), page_nbytes] uint8 on the pools' device into those pages."""
        idx = torch.tensor(pages, dtype=torch.long, device=self.k.device)
        offset = 0
        for t in self._page_parts():
            shape = t[:, 0].shape
            n = t[:, 0].numel() * t.element_size()
            part = data[:, offset:offset + n].contiguous().view(t.dtype).view(len(pages), *shape)
            t.index_copy_(1, idx, part.transpose(0, 1))
            offset += n

    def read_state(self, slot: int) -> torch.Tensor:
        """One slot's state as bytes, [state_nbytes] uint8 on the pools' device."""
        return torch.cat([t[:, slot].contiguous().view(-1).view(torch.uint8) for t in self._state_parts()])

    def write_state(self, slot: int, data: torch.Tensor) -> None:
        """Inverse of read_state."""
        offset = 0
        for t in self._state_parts():
            n = t[:, slot].numel() * t.element_size()
            t[:, slot].copy_(data[offset:offset + n].view(t.dtype).view(t[:, slot].shape))
            offset += n

    def layout(self) -> dict:
        """What the stored bytes of a page and a state mean: shapes and dtypes of the pools (per page / slot)."""
        return {name: [list(t[:, 0].shape), str(t.dtype)] for name, t in
                (("k", self.k), ("v", self.v), ("k_scale", self.k_scale), ("v_scale", self.v_scale),
                 ("conv", self.conv), ("ssm", self.ssm), ("draft_k", self.draft_k), ("draft_v", self.draft_v),
                 ("draft_k_scale", self.draft_k_scale), ("draft_v_scale", self.draft_v_scale), ("ring_k", self.ring_k),
                 ("ring_v", self.ring_v), ("ring_k_scale", self.ring_k_scale), ("ring_v_scale", self.ring_v_scale))
                if t is not None}


class IdPool:
    """A free list of integer ids (pages or state slots)."""

    def __init__(self, n: int):
        self.size = n
        self._free = list(range(n - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.size - len(self._free)

    def take(self, n: int = 1) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"need {n} but only {len(self._free)} of {self.size} are free")
        return [self._free.pop() for _ in range(n)]

    def give(self, ids) -> None:
        self._free.extend(ids)

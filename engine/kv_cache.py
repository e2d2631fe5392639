"""Cache memory: the paged KV pool of the full-attention layers and the GDN state slots.

Full-attention layers keep K/V in fixed-size pages ([num_pages, page_size, Hkv, D] per layer);
a sequence owns a list of pages (its page table). Gated DeltaNet layers keep a fixed-size state
per sequence (conv window [W-1, C] and recurrent state [Hv, K, V] fp32) in numbered slots.
These tensors are passed around as `pools`; what holds which page and slot is the cache
(engine.cache_manager.CacheManager).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig


@dataclass
class CacheTensors:
    """Layer-stacked pools; index [layer] gives one layer's contiguous view.
    Slots hold live sequences' GDN state and, above them, prefix-reuse snapshots of it (engine.snapshots)."""
    k: torch.Tensor             # [n_attn, num_pages, page_size, Hkv, D] (MTP layers last)
    v: torch.Tensor
    k_scale: torch.Tensor | None  # int8 KV: [n_attn, num_pages, page_size, Hkv] fp32 per token and head
    v_scale: torch.Tensor | None
    conv: torch.Tensor          # [n_gdn, num_slots, W-1, conv_dim]
    ssm: torch.Tensor           # [n_gdn, num_slots, Hv, K, V] fp32
    page_size: int

    @staticmethod
    def allocate(cfg: ModelConfig, num_pages: int, page_size: int, num_slots: int,
                 dtype: torch.dtype, device, mtp_layers: int = 0, kv_int8: bool = False) -> "CacheTensors":
        n_attn = len(cfg.full_attention_layers) + mtp_layers
        n_gdn = len(cfg.linear_attention_layers)
        kv_shape = (n_attn, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        kv_dtype = torch.int8 if kv_int8 else dtype
        scales = (lambda: torch.ones(kv_shape[:-1], dtype=torch.float32, device=device)) if kv_int8 else (lambda: None)
        return CacheTensors(
            k=torch.zeros(kv_shape, dtype=kv_dtype, device=device),
            v=torch.zeros(kv_shape, dtype=kv_dtype, device=device),
            k_scale=scales(),
            v_scale=scales(),
            conv=torch.zeros(n_gdn, num_slots, cfg.conv_kernel - 1, cfg.conv_dim, dtype=dtype, device=device),
            ssm=torch.zeros(n_gdn, num_slots, cfg.linear_num_v_heads, cfg.linear_k_head_dim,
                            cfg.linear_v_head_dim, dtype=torch.float32, device=device),
            page_size=page_size,
        )

    def attention_layer(self, i: int) -> tuple:
        """(k, v, k_scale, v_scale) pools of full-attention layer i."""
        ks = self.k_scale[i] if self.k_scale is not None else None
        vs = self.v_scale[i] if self.v_scale is not None else None
        return self.k[i], self.v[i], ks, vs

    def gdn_layer(self, i: int) -> tuple:
        """(conv, recurrent) state pools of GDN layer i."""
        return self.conv[i], self.ssm[i]

    @property
    def num_pages(self) -> int:
        return self.k.shape[1]

    @property
    def num_slots(self) -> int:
        return self.conv.shape[1]

    def copy_state(self, src: int, dst: int) -> None:
        """Copy one slot's GDN state (every layer) into another slot."""
        self.conv[:, dst].copy_(self.conv[:, src])
        self.ssm[:, dst].copy_(self.ssm[:, src])


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

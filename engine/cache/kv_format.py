"""The KV cache formats: how the full-attention layers keep K and V, decided here once.

`EngineConfig.kv_dtype` names one (or "auto", which the memory plan decides: engine/core/memory.py); past the plan
the engine holds a `KVFormat`, allocates its pools from `layouts` (engine/cache/pages.py) and counts its bytes with
`bytes_per_head_token`. The kernels read the format from the pools' dtypes (qwendesk_kernels/attention*.py).
"""

from __future__ import annotations

from enum import Enum

import torch


KV4_GROUP = 64     # channels per fp16 scale of 4-bit K / V (docs/performance.md, KV formats: group 32 vs 64 vs 128)


class KVFormat(str, Enum):
    """A KV format, most precise first (the order `auto` tries them in). Equal to its name as a string, and printed
    as it."""
    BF16 = "bf16"     # the activation dtype (fp32 on the CPU), no scales
    INT8 = "int8"     # int8 K and V, an fp32 scale per token and head
    K8V4 = "k8v4"     # int8 K, 4-bit V: qwendesk_kernels/attention_kv4.py (Hadamard-rotated, two 4-bit channels a
    K4V4 = "k4v4"     # 4-bit K and V                                       byte, fp16 scales per KV4_GROUP channels)

    def __str__(self) -> str:
        return self.value

    @property
    def quantized(self) -> bool:
        return self is not KVFormat.BF16

    @property
    def bits(self) -> tuple[int | None, int | None]:
        """Bits of one K and one V channel, scales apart (None: the activation dtype's)."""
        return {KVFormat.BF16: (None, None), KVFormat.INT8: (8, 8), KVFormat.K8V4: (8, 4),
                KVFormat.K4V4: (4, 4)}[self]

    def layouts(self, head_dim: int, dtype: torch.dtype) -> list[tuple[tuple, torch.dtype] | None]:
        """Per token and kv head: (trailing shape, dtype) of the k, v, k_scale, v_scale pools (scales None when
        unquantized). dtype: the activation dtype."""
        def side(bits):
            if bits == 4:   # small test heads: 2 groups
                return ((head_dim // 2,), torch.uint8), ((head_dim // min(KV4_GROUP, head_dim // 2),), torch.float16)
            if bits == 8:
                return ((head_dim,), torch.int8), ((), torch.float32)
            return ((head_dim,), dtype), None
        (k, k_scale), (v, v_scale) = (side(b) for b in self.bits)
        return [k, v, k_scale, v_scale]

    @property
    def drafter(self) -> KVFormat:
        """A block drafter's context K / V beside pools of this format: int8 where this one is quantized (the 4-bit
        formats' rotation and groups are the model's attention kernels' own), else the activation dtype."""
        return KVFormat.INT8 if self.quantized else KVFormat.BF16

    def bytes_per_head_token(self, head_dim: int, dtype: torch.dtype) -> int:
        """K and V bytes (scales included) of one token in one kv head."""
        return sum(torch.Size(shape).numel() * dt.itemsize for shape, dt in filter(None, self.layouts(head_dim, dtype)))

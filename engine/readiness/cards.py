"""The consumer cards the readiness check compiles for, and what of each one a compile is checked against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    name: str
    capability: tuple[int, int]
    sms: int
    smem_per_block: int       # cudaDevAttrMaxSharedMemoryPerBlockOptin
    smem_per_sm: int          # cudaDevAttrMaxSharedMemoryPerMultiprocessor


# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": 99 KB per block on all three,
# 100 KB per SM on sm_86 / sm_89, 128 KB on sm_120
CARDS = (Card("RTX 3090", (8, 6), 82, 101_376, 102_400), Card("RTX 4090", (8, 9), 128, 101_376, 102_400),
         Card("RTX 5090", (12, 0), 170, 101_376, 131_072))

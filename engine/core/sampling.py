"""A batch's sampling parameters as tensors: the one route from its sequences' SamplingParams to what the samplers read
(qwendesk_kernels/sampling.py `sample` in a plain step, engine/spec/acceptance.py in a speculative round).

A row is a few numbers per sequence (`SamplingRow.of`: no work that grows with the context); `Sampling.of` makes the
batch's host tensors and `to` puts them on the device from page-locked memory, so the host never waits for a step
still running (engine/core/device.py pinned). A captured round copies them into its static inputs instead
(engine/spec/rounds.py round_inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.device import pinned
from engine.core.sequence import Sequence
from qwendesk_kernels.sampling import Penalties


@dataclass
class SamplingRow:
    """One row's sampling parameters on the host; the defaults are a greedy padding row."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    steps: int = 0              # tokens the request generated before this step (the seeded draws count them)
    seeded: bool = False        # the request gave a seed (its output must reproduce)

    @classmethod
    def of(cls, seq: Sequence, ahead: int = 0) -> SamplingRow:
        """seq's row; ahead: tokens sampled before this step that its output does not hold yet (a step in flight)."""
        p = seq.params
        return cls(p.temperature, p.top_k, p.top_p, p.min_p, seq.seed, len(seq.output) + ahead, p.seed is not None)


@dataclass
class Sampling:
    """Per-row sampling parameters as tensors ([B] each), on the host (`of`) or the device (`to`)."""
    temperature: torch.Tensor   # fp32
    top_k: torch.Tensor         # int64
    top_p: torch.Tensor         # fp32
    min_p: torch.Tensor         # fp32
    seeds: torch.Tensor         # int64
    steps: torch.Tensor         # int64: SamplingRow.steps
    seeded: torch.Tensor        # bool

    @classmethod
    def of(cls, rows: list[SamplingRow]) -> Sampling:
        """The rows' host tensors."""
        return cls(torch.tensor([r.temperature for r in rows], dtype=torch.float32),
                   torch.tensor([r.top_k for r in rows], dtype=torch.int64),
                   torch.tensor([r.top_p for r in rows], dtype=torch.float32),
                   torch.tensor([r.min_p for r in rows], dtype=torch.float32),
                   torch.tensor([r.seed for r in rows], dtype=torch.int64),
                   torch.tensor([r.steps for r in rows], dtype=torch.int64),
                   torch.tensor([r.seeded for r in rows], dtype=torch.bool))

    def tensors(self) -> list[torch.Tensor]:
        return [self.temperature, self.top_k, self.top_p, self.min_p, self.seeds, self.steps, self.seeded]

    def rows(self, index: torch.Tensor) -> Sampling:
        return Sampling(*(t[index] for t in self.tensors()))

    def to(self, device) -> Sampling:
        """On `device`, copied from page-locked memory (no wait for the GPU)."""
        return Sampling(*(pinned(t).to(device, non_blocking=True) for t in self.tensors()))


def penalties_of(seqs: list[Sequence], logits: torch.Tensor) -> Penalties | None:
    """The presence, frequency and repetition penalties of a step's sequences (None when none has any): dense
    [N, V] counts of each one's output tokens and its prompt's tokens, built on the logits' device (the host
    sampling path: such a step is never in flight)."""
    ps = [s.params for s in seqs]
    if not any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0 for p in ps):
        return None
    dev = logits.device
    counts = torch.zeros(logits.shape, dtype=torch.int32, device=dev)
    in_prompt = torch.zeros_like(logits, dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s.output:
            counts[i].index_add_(0, torch.tensor(s.output, device=dev),
                                 torch.ones(len(s.output), dtype=torch.int32, device=dev))
        in_prompt[i, torch.tensor(s.prompt, device=dev)] = True
    weights = [torch.tensor(w, dtype=torch.float32) for w in ([p.presence_penalty for p in ps],
                                                              [p.frequency_penalty for p in ps],
                                                              [p.repetition_penalty for p in ps])]
    return Penalties(counts, in_prompt, *(pinned(w).to(dev, non_blocking=True) for w in weights))

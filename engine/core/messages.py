"""What other threads post to the engine's loop (EngineLoop.post): one small type per message."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.sequence import Sequence

if TYPE_CHECKING:
    from engine.spec.rounds import DraftHook


@dataclass
class Submit:
    seq: Sequence


@dataclass
class Cancel:
    request_id: int


@dataclass
class Warm:
    """Read what the tiers hold of a prompt's prefix; `done` gets the prompt tokens a request would reuse."""
    ids: list[int]
    done: Future
    looked: int = -1        # CacheManager.reads_done at its last lookup


@dataclass
class Score:
    ids: list[int]
    done: Future


@dataclass
class SetDraftOracle:
    """Benchmarks and tests: drafts replaced per a DraftOracle (engine/spec/speculation.py use_oracle)."""
    oracle: DraftHook | None
    adaptive: bool
    done: Future


@dataclass
class Stop:
    pass


Message = Submit | Cancel | Warm | Score | SetDraftOracle | Stop

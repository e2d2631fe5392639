"""A model load in words and as a fraction: the engine's current stage with its done / total, and the
time left in that stage at its pace so far."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.formatting import human_duration

COUNTED = 1000      # a stage's total up to this is a count worth showing ("12 of 40"); above it, weights' sizes: a %


@dataclass
class LoadProgress:
    name: str
    started: float = field(default_factory=time.monotonic)
    stage: str = "Starting"
    done: int = 0
    total: int = 0
    stage_started: float = 0.0

    def update(self, stage: str, done: int, total: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if stage != self.stage:
            self.stage, self.stage_started = stage, now
        self.done, self.total = done, total

    @property
    def fraction(self) -> float | None:
        """Of the current stage; None while the engine gives no count."""
        return min(1.0, self.done / self.total) if self.total > 1 else None

    def eta_s(self, now: float | None = None) -> float | None:
        """From the stage's pace since its first step (the first one's wait is the stage starting up)."""
        now = time.monotonic() if now is None else now
        if self.total <= 1 or self.done < 3 or now - self.stage_started < 1.0:
            return None
        return (now - self.stage_started) / (self.done - 1) * (self.total - self.done)

    def text(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        parts = [f"Loading {self.name}", self.stage]
        if self.total > COUNTED:
            parts.append(f"{self.done / self.total:.0%}")
        elif self.total > 1:
            parts.append(f"{self.done} of {self.total}")
        eta = self.eta_s(now)
        if eta is not None:
            parts.append(f"about {human_duration(eta)} left")
        parts.append(human_duration(now - self.started))
        return "  ·  ".join(parts)

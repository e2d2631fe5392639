"""The local model's load state: one record (`LoadState`) that the engine thread keeps on the GUI thread
(`EngineThread.state`) and announces (`EngineThread.state_changed`); every page reads it from there.

The engine thread's worker reports what happened to load number n (`Progress`, `Loaded`, `Failed`, `Cancelled`,
`Unloaded`); only the latest load's reports change the state (`LoadState.after`), so a load that gave way to another
one, or an unload queued before a new load, cannot undo what the user asked for last."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from app.load_progress import LoadProgress

if TYPE_CHECKING:
    from engine.api import MemoryPlan


class Phase(Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@dataclass(frozen=True)
class LoadedModel:
    name: str
    path: str
    device: str             # cuda | cpu
    profile: str
    max_context: int
    plan: MemoryPlan        # what the engine runs with (weights, context, memory)
    load_seconds: float
    vision: bool = False    # the engine takes images in chat messages


@dataclass(frozen=True)
class Progress:
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class Loaded:
    model: LoadedModel


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass(frozen=True)
class Cancelled:
    pass


@dataclass(frozen=True)
class Unloaded:
    pass


LoadReport = Progress | Loaded | Failed | Cancelled | Unloaded


@dataclass(frozen=True)
class LoadState:
    phase: Phase = Phase.UNLOADED
    path: str = ""                          # the checkpoint loading, loaded, or whose load failed ("" when unloaded)
    progress: LoadProgress | None = None    # LOADING: how far it is (updated in place as the engine reports)
    model: LoadedModel | None = None        # LOADED
    message: str = ""                       # FAILED: why; UNLOADED: how the last load ended when it was cancelled

    @staticmethod
    def loading(path: str) -> LoadState:
        return LoadState(Phase.LOADING, path, progress=LoadProgress(Path(path).name))

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def idle(self) -> bool:
        """No model loaded or loading (one whose load failed holds no memory)."""
        return self.phase in (Phase.UNLOADED, Phase.FAILED)

    def path_if(self, phase: Phase) -> str:
        return self.path if self.phase is phase else ""

    def phase_of(self, path: str) -> Phase:
        """LOADING or LOADED while `path` is the checkpoint loading or loaded; UNLOADED otherwise."""
        return self.phase if path and path == self.path and not self.idle else Phase.UNLOADED

    def after(self, report: Loaded | Failed | Cancelled | Unloaded) -> LoadState:
        """The state once the current load ended, or the model it loaded was unloaded."""
        if isinstance(report, Loaded):
            return LoadState(Phase.LOADED, report.model.path, model=report.model)
        if isinstance(report, Failed):
            return LoadState(Phase.FAILED, self.path, message=report.message)
        if isinstance(report, Cancelled):
            return LoadState(message=f"Loading {self.name} was cancelled")
        return LoadState()

"""A stage's saved progress: where and how often it is saved, and whether a saved state
may be resumed (the file's format: :mod:`harness.training.progress_file`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from harness.common.cache import ArtifactCache
from harness.config.schema import TrainConfig
from harness.training.progress_file import (
    ProgressRefusedError,
    load_progress_file,
    save_progress_file,
)


@dataclass(frozen=True)
class StageCheckpoint:
    """Where a long stage keeps its progress, and how often it saves it, so that a killed
    process resumes the stage where it was instead of starting it again.  A saved state
    holds the weights, the optimiser, the schedule, the position in the epoch and every
    random state, so a resumed stage trains exactly as one that was never stopped."""

    path: Path
    every_seconds: float = 600.0
    every_steps: int | None = None
    """Save after this many steps too (None: by time only)."""
    made_from: Callable[[], Iterable[tuple[str, str]]] = tuple
    """The cache entries (kind, key) the stage reads besides its inputs (a general stage's
    :meth:`~harness.api.Method.general_made_from`), asked at each save.  With ``cache``,
    the saved state records their digests, and is not resumed once one of them holds
    another build: the resumed stage would train on a mix of the two."""
    cache: ArtifactCache | None = None

    def sources(self) -> dict[str, str | None]:
        """``kind/key`` -> digest of the files of each entry :attr:`made_from` names."""
        return self.cache.source_digests(self.made_from()) if self.cache is not None else {}

    def changed_source(self, recorded: dict[str, str | None]) -> str | None:
        """Why a state that recorded ``recorded`` (:meth:`sources` when it was saved) was
        made from entries other than the cache's now; None when each is the same build.
        One removed since counts as changed: it is made again, perhaps with other
        contents, when the stage reads it."""
        if self.cache is None:
            return None
        changed = self.cache.changed_source(recorded, removed=True)
        return f"it was saved from {changed}" if changed else None


PROGRESS_KEYS = frozenset({
    "config", "total_steps", "made_from", "student", "extra", "optimizer", "scheduler",
    "scaler", "batch_generator", "torch_rng", "cuda_rng", "step", "epoch", "next_batch",
    "best_score", "best_state", "window", "result"})
"""What a saved state holds (:meth:`StageSaves.save`); one that lacks any is not resumed."""


class StageSaves:
    """A stage's saves: the saved state it resumes from, and when it saves again.

    Saved progress is for one process: with several, nothing is saved or resumed (the
    ``log`` line says so)."""

    def __init__(self, checkpoint: StageCheckpoint | None, config: TrainConfig,
                 total_steps: int, stage: str, accelerator: Accelerator,
                 log: Callable[[str], None]) -> None:
        if checkpoint is not None and accelerator.num_processes > 1:
            log(f"[engine] {stage}: saved progress is for one process; not saving")
            checkpoint = None
        self.checkpoint = checkpoint
        self.config = config
        self.total_steps = total_steps
        self.log = log
        self.last_save = time.perf_counter()

    def load(self) -> dict[str, Any] | None:
        """The saved state to resume from, or None (see :func:`load_progress`)."""
        return load_progress(self.checkpoint, self.config, self.total_steps, self.log)

    def restart_clock(self) -> None:
        """Count the time to the next save from now."""
        self.last_save = time.perf_counter()

    def due(self, step: int) -> bool:
        """Whether to save after ``step``: never after the last, else once ``every_seconds``
        passed since the last save, or on a multiple of ``every_steps``."""
        checkpoint = self.checkpoint
        return checkpoint is not None and step < self.total_steps and (
            time.perf_counter() - self.last_save >= checkpoint.every_seconds
            or bool(checkpoint.every_steps and step % checkpoint.every_steps == 0))

    def save(self, state: dict[str, Any]) -> None:
        """Save ``state`` (every key of :data:`PROGRESS_KEYS` but the three this adds: the
        configuration, the budget and the sources' digests)."""
        if self.checkpoint is None:
            raise RuntimeError("saving a stage's progress without a checkpoint")
        save_progress(self.checkpoint, {
            "config": self.config.model_dump(mode="json"), "total_steps": self.total_steps,
            "made_from": self.checkpoint.sources(), **state})
        self.restart_clock()


def save_progress(checkpoint: StageCheckpoint, state: dict[str, Any]) -> None:
    """Written beside, then renamed over the previous state: a kill while saving leaves
    the previous state whole (the format: :mod:`harness.training.progress_file`)."""
    save_progress_file(checkpoint.path, state)


def load_progress(checkpoint: StageCheckpoint | None, config: TrainConfig, total_steps: int,
                  log: Callable[[str], None]) -> dict[str, Any] | None:
    """The state saved at ``checkpoint``, or None (with a line saying why) when there is
    none to resume: a file that is not whole saved progress of this format (a pickle of
    an older version included: never loaded), or one saved for another budget or from
    other builds of the cache entries the stage reads."""
    if checkpoint is None:
        return None
    drop_pickled_progress(checkpoint.path, log)
    if not checkpoint.path.exists():
        return None
    try:
        state = load_progress_file(checkpoint.path)
    except ProgressRefusedError as error:
        log(f"[engine] {checkpoint.path}: {error}; starting over")
        return None
    if missing := sorted(PROGRESS_KEYS - state.keys()):
        log(f"[engine] {checkpoint.path}: saved progress without {', '.join(missing)}; "
            "starting over")
        return None
    if (state["config"] != config.model_dump(mode="json")
            or state["total_steps"] != total_steps):
        log(f"[engine] {checkpoint.path}: saved for another budget; starting over")
        return None
    recorded = state["made_from"]
    if not isinstance(recorded, dict) or (changed := checkpoint.changed_source(recorded)):
        log(f"[engine] {checkpoint.path}: {changed or 'its sources are unreadable'}; "
            "starting over")
        return None
    return state


def drop_pickled_progress(path: Path, log: Callable[[str], None]) -> None:
    """Remove the ``.pt`` pickle an older version of the harness saved the same stage's
    progress to (beside ``path``), saying so: it is never loaded, and the stage starts
    over."""
    pickled = path.with_suffix(".pt")
    if pickled != path and pickled.is_file():
        log(f"[engine] {pickled}: saved progress in the older pickle format, which is never "
            "loaded; removed it, starting over")
        pickled.unlink(missing_ok=True)

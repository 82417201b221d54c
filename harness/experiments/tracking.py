"""Experiment trackers (TensorBoard, Weights & Biases, MLflow, Aim) through accelerate's.

Every run that trains is one tracker run, named like its record in the results store
(``<suite>/<method>/<task>/<student>-seed<seed>-<run id>``, under ``tuning/<study>/`` for
a tuning trial's runs), with the run id and the resolved configuration as its
hyper-parameters.  A process runs many runs (a grid, a study), so the tracker objects are
built, started and finished per run here rather than through ``Accelerator.init_trackers``,
which sets up one set of trackers for the life of its accelerator.

What a run logs, at the engine's logging points, on one step axis across its stages:

- ``<stage>/loss/<term>`` for each of the stage's loss terms and ``<stage>/loss/total``,
  ``<stage>/lr`` and ``<stage>/epoch``, at every ``log_every_steps``;
- ``<stage>/dev/<metric>`` at every dev evaluation of the stage;
- ``final/<split>/<metric>`` for the best checkpoint's scores on every dev split (and
  ``final/pct_of_teacher``), at the run's last step.

A general (corpus) stage shows up in the run that trains it; in runs that find it cached
the step axis begins with the first task stage.  A run the store already has is skipped
and logs nothing.  Only the main process of an ``accelerate launch`` logs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

from accelerate.tracking import (
    AimTracker,
    GeneralTracker,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
)
from accelerate.utils import (
    is_aim_available,
    is_mlflow_available,
    is_tensorboard_available,
    is_wandb_available,
)

PROJECT = "distill-bench"
"""The W&B project, MLflow experiment and Aim experiment every run goes to."""

BACKENDS: dict[str, tuple[Callable[[], bool], str]] = {
    "tensorboard": (is_tensorboard_available, "pip install tensorboard"),
    "wandb": (is_wandb_available, "pip install wandb"),
    "mlflow": (is_mlflow_available, "pip install mlflow"),
    # accelerate's tracker is written for Aim 3 (it refuses 4.x).
    "aim": (is_aim_available, "pip install 'aim<4'"),
}
"""The trackers ``--log-with`` accepts: how accelerate tells whether each is installed,
and how to install it."""


class TrackerError(ValueError):
    """An unknown tracker, or one whose package is missing (the message says what to do)."""


def check_backends(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` in order, once each, after checking that each is a tracker this harness
    knows and that its package is installed (raises :class:`TrackerError` otherwise)."""
    chosen: list[str] = []
    for name in names:
        key = name.strip().lower()
        if key not in BACKENDS:
            raise TrackerError(f"--log-with {name}: unknown tracker; choose "
                               f"{', '.join(BACKENDS)}")
        available, install = BACKENDS[key]
        if not available():
            raise TrackerError(f"--log-with {key}: the {key} package is not installed "
                               f"(`{install}`)")
        if key not in chosen:
            chosen.append(key)
    return tuple(chosen)


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists and other non-scalars as JSON text, since
    TensorBoard and MLflow take only scalar hyper-parameters (None stays None: TensorBoard
    leaves it out)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif value is None or isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, sort_keys=True, default=str)
    return flat


@dataclass(frozen=True)
class Tracking:
    """Which trackers a command logs to, and where the local ones write."""

    backends: tuple[str, ...]
    log_dir: Path
    """TensorBoard's event files and Aim's repository; W&B's local files. MLflow writes
    where ``MLFLOW_TRACKING_URI`` points (else its own default: ``./mlflow.db`` for
    MLflow 3, ``./mlruns`` before)."""

    @classmethod
    def of(cls, names: Iterable[str] | None, log_dir: Path) -> Tracking | None:
        """Checked ``--log-with`` names (None: no tracking)."""
        backends = check_backends(names or [])
        return cls(backends, Path(log_dir)) if backends else None

    def start(self, name: str, params: Mapping[str, Any]) -> RunTracker:
        """Start one tracker run per backend, named ``name``, with ``params`` (nested: they
        are flattened) as its hyper-parameters."""
        name = self._claim(name)
        flat = flatten({"tracker_run": name, **params})
        trackers: list[GeneralTracker] = []
        try:
            for backend in self.backends:
                tracker = self._tracker(backend, name)
                try:
                    tracker.start()
                except Exception as error:  # not logged in, an unreachable server, ...
                    raise TrackerError(f"--log-with {backend}: could not start a run: "
                                       f"{error}") from error
                trackers.append(tracker)
                tracker.store_init_configuration(flat)
        except BaseException:
            for tracker in trackers:
                tracker.finish()
            raise
        return RunTracker(trackers, name)

    def _claim(self, name: str) -> str:
        """``name``, or ``name-attempt<N>`` when an earlier attempt of the run (killed, or
        failed and retried) already has a TensorBoard folder of that name: each attempt
        gets its own curves."""
        if "tensorboard" not in self.backends:
            return name
        for attempt in count(1):
            candidate = name if attempt == 1 else f"{name}-attempt{attempt}"
            folder = self.log_dir / candidate
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder.mkdir()  # atomic: two workers never share a folder
            except FileExistsError:
                continue
            return candidate
        raise AssertionError("unreachable")

    def _tracker(self, backend: str, name: str) -> GeneralTracker:
        if backend == "tensorboard":
            return TensorBoardTracker(name, self.log_dir)
        if backend == "wandb":
            self.log_dir.mkdir(parents=True, exist_ok=True)
            # accelerate passes its first argument to wandb.init as the project.
            return WandBTracker(PROJECT, name=name, dir=str(self.log_dir))
        if backend == "mlflow":
            return MLflowTracker(experiment_name=PROJECT, run_name=name)
        if backend == "aim":
            return AimTracker(name, str(self.log_dir), experiment=PROJECT)
        raise TrackerError(f"unknown tracker {backend!r}")


class RunTracker:
    """One run's tracker runs (none: logs nothing), fed by the runner around the engine.

    Steps are global over the run's stages: a stage's step ``s`` is logged at the steps
    the run's earlier stages took plus ``s``."""

    def __init__(self, trackers: Iterable[GeneralTracker] = (), name: str | None = None
                 ) -> None:
        self.trackers = list(trackers)
        self.name = name
        self.step = 0
        self._stage: str | None = None
        self._offset = 0

    def begin_stage(self, stage: str) -> None:
        self._stage = stage
        self._offset = self.step

    def end_stage(self, steps: int) -> None:
        """The stage took ``steps`` optimiser steps in all."""
        self.step = self._offset + steps
        self._stage = None

    def log_losses(self, entry: Mapping[str, float]) -> None:
        """An entry of the engine's loss history: step, epoch, lr, every term and ``loss``
        (the weighted total)."""
        stage = self._current()
        values = {f"{stage}/loss/{'total' if key == 'loss' else key}": value
                  for key, value in entry.items() if key not in {"step", "epoch", "lr"}}
        values[f"{stage}/lr"] = entry["lr"]
        values[f"{stage}/epoch"] = entry["epoch"]
        self.log(values, int(entry["step"]))

    def log_evaluation(self, evaluation: Mapping[str, Any]) -> None:
        """A dev evaluation as the engine reports it (stage, step, epoch, metrics)."""
        stage = self._current()
        self.log({f"{stage}/dev/{metric}": value
                  for metric, value in evaluation["metrics"].items()}, int(evaluation["step"]))

    def log_final(self, dev: Mapping[str, Mapping[str, float]],
                  pct_of_teacher: float | None) -> None:
        """The run's dev scores (per split and metric) at its last step."""
        values = {f"final/{split}/{metric}": value
                  for split, metrics in dev.items() for metric, value in metrics.items()}
        if pct_of_teacher is not None:
            values["final/pct_of_teacher"] = pct_of_teacher
        for tracker in self.trackers:
            tracker.log(values, step=self.step)

    def log(self, values: dict[str, float], stage_step: int) -> None:
        step = self._offset + stage_step
        self.step = max(self.step, step)
        for tracker in self.trackers:
            tracker.log(values, step=step)

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []

    def _current(self) -> str:
        if self._stage is None:
            raise RuntimeError("a tracker logged outside a stage (begin_stage first)")
        return self._stage

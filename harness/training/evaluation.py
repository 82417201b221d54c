"""Dev evaluation during a training stage, and the checkpoint the stage ends with: the
last one or the best dev evaluation's (the suite's ``selection``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn

from harness.api.method import Stage
from harness.config.schema import Selection
from harness.data.features import EncodedSplit
from harness.data.metrics import TaskEvaluator
from harness.training.results import NonFiniteLossError, StageResult

Predict = Callable[..., np.ndarray]
"""How logits are computed: :func:`harness.training.prediction.predict_logits`'s signature."""


class CheckpointSelection:
    """The best dev score so far and, under ``best-dev``, the weights that scored it (on
    the CPU); the first of equal scores is the best."""

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.best_score = -math.inf
        self.best_state: dict[str, torch.Tensor] | None = None

    def offer(self, main: float, metrics: dict[str, float], step: int, result: StageResult,
              model: nn.Module) -> None:
        """An evaluation of ``model`` at ``step`` that scored ``main``: the result's best
        (``best_metrics``, ``best_step``) when it beats the best so far, its weights
        kept under ``best-dev``."""
        if main > self.best_score:
            self.best_score = main
            result.best_metrics = metrics
            result.best_step = step
            if self.selection == "best-dev":
                self.best_state = {k: v.detach().cpu().clone()
                                   for k, v in model.state_dict().items()}

    def load_selected(self, model: nn.Module) -> None:
        """Leave ``model`` with the selected checkpoint: the kept best one under
        ``best-dev`` (once evaluated), else as it is (the last)."""
        if self.best_state is not None:
            model.load_state_dict(self.best_state)

    def state(self) -> dict[str, Any]:
        """The best score and weights, as progress saves them."""
        return {"best_score": self.best_score, "best_state": self.best_state}

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from what :meth:`state` gave."""
        self.best_score, self.best_state = saved["best_score"], saved["best_state"]


class DevEvaluation:
    """Scores the student on the dev split every ``every_steps`` steps and at the last,
    in fp32 whatever the steps train in: the best checkpoint is chosen by, and records,
    the scores a plain load of it reproduces.

    ``on_evaluate`` sees every evaluation (stage, step, epoch, metrics, ``main``) as it
    happens; an exception it raises (e.g. a pruned tuning trial) stops the stage."""

    def __init__(self, *, stage: Stage, split: EncodedSplit | None, evaluator: TaskEvaluator,
                 every_steps: int, total_steps: int, batch_size: int,
                 accelerator: Accelerator, selection: CheckpointSelection,
                 forward: Callable[[dict[str, torch.Tensor]], Any], predict: Predict,
                 on_evaluate: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.stage = stage
        self.split = split
        self.evaluator = evaluator
        self.every_steps = every_steps
        self.total_steps = total_steps
        self.batch_size = batch_size
        self.accelerator = accelerator
        self.selection = selection
        self.forward = forward
        self.predict = predict
        self.on_evaluate = on_evaluate

    def due(self, step: int) -> bool:
        """Whether the stage evaluates after ``step``."""
        return self.stage.evaluate and self.split is not None and (
            step % self.every_steps == 0 or step == self.total_steps)

    def run(self, student: nn.Module, model: nn.Module, result: StageResult, step: int,
            epoch: float) -> None:
        """Evaluate ``student`` (``model`` once unwrapped) after ``step``, record it in
        ``result.evaluations`` and offer it to the selection; ``student`` trains again
        after."""
        split = self.split
        if split is None:
            raise ValueError(f"stage {self.stage.name!r}: no dev split to evaluate on")
        logits = self.predict(student, split, self.accelerator, self.batch_size, "no",
                              forward=self.forward)
        if not np.isfinite(logits).all():  # diverged: no score from these
            raise NonFiniteLossError(self.stage.name, step, {
                "values": float(np.sum(~np.isfinite(logits)))}, what="dev logits")
        metrics = self.evaluator.score(logits, split.labels)
        result.evaluations.append({"step": step, "epoch": epoch, **metrics})
        main = metrics[self.evaluator.task.main_metric]
        if self.on_evaluate is not None:
            self.on_evaluate({"stage": self.stage.name, "step": step, "epoch": epoch,
                              "metrics": metrics, "main": main})
        self.selection.offer(main, metrics, step, result, model)
        student.train()

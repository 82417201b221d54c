"""Task metrics through ``evaluate``, from the local module shipped with the package."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import evaluate
import numpy as np

from harness.data.tasks import TaskSpec

METRIC_MODULE = Path(__file__).resolve().parent / "glue_metric"


@cache
def _load(config_name: str) -> evaluate.EvaluationModule:
    return evaluate.load(str(METRIC_MODULE), config_name)


class TaskEvaluator:
    """Turns logits into a task's metrics, on the 0-100 scale GLUE papers report."""

    def __init__(self, task: TaskSpec) -> None:
        self.task = task
        self._metric = _load(task.hub_config)

    def predictions(self, logits: np.ndarray) -> np.ndarray:
        logits = np.asarray(logits)
        if self.task.is_regression:
            return logits.reshape(len(logits), -1)[:, 0]
        return logits.argmax(axis=-1)

    def score_predictions(self, predictions: np.ndarray, references: np.ndarray
                          ) -> dict[str, float]:
        predictions = np.asarray(predictions)
        if not np.isfinite(predictions.astype(float)).all():
            raise ValueError(f"{self.task.name}: {int(np.sum(~np.isfinite(predictions)))} of "
                             f"{len(predictions)} predictions are not finite (NaN or inf); "
                             "no score is computed from them")
        raw = self._metric.compute(predictions=predictions, references=references)
        constant = predictions.size == 0 or np.ptp(predictions) == 0 or np.ptp(
            np.asarray(references, dtype=float)) == 0
        scores = {}
        for name in self.task.metrics:
            value = float(raw[name])
            if math.isnan(value) and not constant:
                raise ValueError(f"{self.task.name}: {name} is undefined on these "
                                 "predictions and references")
            # a correlation with a constant is undefined: no skill, scored 0 (as STS-B's
            # mean baseline is)
            scores[name] = 0.0 if math.isnan(value) else 100.0 * value
        return scores

    def score(self, logits: np.ndarray, references: np.ndarray) -> dict[str, float]:
        return self.score_predictions(self.predictions(logits), references)

    def baseline(self, train_labels: np.ndarray, references: np.ndarray) -> dict[str, float]:
        """Majority class (classification) or mean score (regression) predicted everywhere."""
        if self.task.is_regression:
            constant = np.full(len(references), float(np.mean(train_labels)), dtype=np.float32)
        else:
            labelled = train_labels[train_labels >= 0]
            majority = np.bincount(labelled, minlength=self.task.num_labels).argmax()
            constant = np.full(len(references), majority, dtype=np.int64)
        return self.score_predictions(constant, references)

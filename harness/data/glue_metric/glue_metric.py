"""GLUE metrics as a local `evaluate` module, loadable offline by path.

``evaluate.load("glue")`` needs the hub; this module is shipped inside the package and
loaded with ``evaluate.load(<this folder>, config_name=<task>)``.  The formulas are written
out in numpy (not delegated to scikit-learn / scipy) so the unit tests can check them
against those libraries independently.
"""

import datasets
import evaluate
import numpy as np

_CLASSIFICATION = {"cola", "sst2", "mrpc", "qqp", "mnli", "mnli_matched", "mnli_mismatched",
                   "qnli", "rte", "wnli", "ax"}
_REGRESSION = {"stsb"}


def _accuracy(predictions: np.ndarray, references: np.ndarray) -> float:
    return float(np.mean(predictions == references))


def _binary_f1(predictions: np.ndarray, references: np.ndarray) -> float:
    true_pos = float(np.sum((predictions == 1) & (references == 1)))
    false_pos = float(np.sum((predictions == 1) & (references != 1)))
    false_neg = float(np.sum((predictions != 1) & (references == 1)))
    denominator = 2 * true_pos + false_pos + false_neg
    return 0.0 if denominator == 0 else 2 * true_pos / denominator


def _matthews(predictions: np.ndarray, references: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K), 0 when undefined."""
    classes = np.union1d(predictions, references)
    index = {c: i for i, c in enumerate(classes)}
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    for ref, pred in zip(references, predictions, strict=True):
        confusion[index[ref], index[pred]] += 1
    total = confusion.sum()
    correct = np.trace(confusion)
    true_counts = confusion.sum(axis=1)
    pred_counts = confusion.sum(axis=0)
    covariance = correct * total - true_counts @ pred_counts
    denominator = np.sqrt(total**2 - pred_counts @ pred_counts) * np.sqrt(
        total**2 - true_counts @ true_counts
    )
    return 0.0 if denominator == 0 else float(covariance / denominator)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x_centred = x - x.mean()
    y_centred = y - y.mean()
    denominator = np.sqrt((x_centred**2).sum() * (y_centred**2).sum())
    return float("nan") if denominator == 0 else float((x_centred * y_centred).sum() / denominator)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks starting at 1, ties sharing their average rank (as Spearman requires)."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    ranks = np.empty(len(values), dtype=np.float64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    return _pearson(_average_ranks(x), _average_ranks(y))


class GlueMetric(evaluate.Metric):
    """Accuracy / F1 / Matthews / Pearson / Spearman, per GLUE task (config name)."""

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in _CLASSIFICATION | _REGRESSION:
            raise KeyError(
                f"unknown GLUE config {self.config_name!r}; "
                f"expected one of {sorted(_CLASSIFICATION | _REGRESSION)}"
            )
        dtype = "float32" if self.config_name in _REGRESSION else "int64"
        return evaluate.MetricInfo(
            description="GLUE task metrics, computed offline.",
            citation="Wang et al., GLUE, ICLR 2019.",
            inputs_description="predictions and references: class ids, or scores for stsb",
            features=datasets.Features(
                {"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}
            ),
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        predictions = np.asarray(predictions)
        references = np.asarray(references)
        if self.config_name == "stsb":
            predictions = predictions.astype(np.float64)
            references = references.astype(np.float64)
            return {
                "pearson": _pearson(predictions, references),
                "spearmanr": _spearman(predictions, references),
            }
        if self.config_name == "cola":
            return {"matthews_correlation": _matthews(predictions, references)}
        if self.config_name in {"mrpc", "qqp"}:
            return {
                "accuracy": _accuracy(predictions, references),
                "f1": _binary_f1(predictions, references),
            }
        return {"accuracy": _accuracy(predictions, references)}

"""Tests for the local GLUE metric module and TaskEvaluator, checked against sklearn / scipy."""

from __future__ import annotations

import math

import evaluate
import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

import harness.data.metrics
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task

SIZES = [7, 64, 513]
_LOADED: dict[str, evaluate.EvaluationModule] = {}


def metric(config: str) -> evaluate.EvaluationModule:
    if config not in _LOADED:
        _LOADED[config] = evaluate.load(str(harness.data.metrics.METRIC_MODULE), config)
    return _LOADED[config]


def labels(rng: np.random.Generator, size: int, classes: int) -> np.ndarray:
    return rng.integers(0, classes, size=size).astype(np.int64)


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("config", ["sst2", "rte", "mnli", "qnli"])
def test_accuracy_matches_sklearn(config: str, size: int) -> None:
    rng = np.random.default_rng(size)
    classes = 3 if config == "mnli" else 2
    refs, preds = labels(rng, size, classes), labels(rng, size, classes)
    result = metric(config).compute(predictions=preds, references=refs)
    assert set(result) == {"accuracy"}
    assert result["accuracy"] == pytest.approx(accuracy_score(refs, preds), abs=1e-12)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("config", ["mrpc", "qqp"])
def test_accuracy_and_f1_match_sklearn(config: str, size: int) -> None:
    rng = np.random.default_rng(100 + size)
    refs, preds = labels(rng, size, 2), labels(rng, size, 2)
    result = metric(config).compute(predictions=preds, references=refs)
    assert set(result) == {"accuracy", "f1"}
    assert result["accuracy"] == pytest.approx(accuracy_score(refs, preds), abs=1e-12)
    assert result["f1"] == pytest.approx(f1_score(refs, preds), abs=1e-12)


def test_f1_with_skewed_predictions_matches_sklearn() -> None:
    rng = np.random.default_rng(5)
    refs = (rng.random(300) < 0.7).astype(np.int64)
    preds = (rng.random(300) < 0.1).astype(np.int64)
    result = metric("mrpc").compute(predictions=preds, references=refs)
    assert result["f1"] == pytest.approx(f1_score(refs, preds), abs=1e-12)


def test_f1_without_positive_predictions_is_zero() -> None:
    refs = np.array([1, 0, 1, 1, 0], dtype=np.int64)
    preds = np.zeros(5, dtype=np.int64)
    result = metric("mrpc").compute(predictions=preds, references=refs)
    assert result["f1"] == 0.0
    assert result["f1"] == f1_score(refs, preds, zero_division=0.0)
    assert result["accuracy"] == pytest.approx(0.4)


def test_f1_without_any_positive_is_zero() -> None:
    zeros = np.zeros(6, dtype=np.int64)
    result = metric("qqp").compute(predictions=zeros, references=zeros)
    assert result["f1"] == 0.0 == f1_score(zeros, zeros, zero_division=0.0)
    assert result["accuracy"] == 1.0


@pytest.mark.parametrize("size", SIZES)
def test_binary_matthews_matches_sklearn(size: int) -> None:
    rng = np.random.default_rng(200 + size)
    refs = labels(rng, size, 2)
    # correlated predictions, so the coefficient is far from 0
    preds = np.where(rng.random(size) < 0.75, refs, 1 - refs)
    result = metric("cola").compute(predictions=preds, references=refs)
    assert set(result) == {"matthews_correlation"}
    assert result["matthews_correlation"] == pytest.approx(matthews_corrcoef(refs, preds),
                                                           abs=1e-12)


@pytest.mark.parametrize("size", SIZES)
def test_three_class_matthews_matches_sklearn(size: int) -> None:
    rng = np.random.default_rng(300 + size)
    refs = labels(rng, size, 3)
    preds = np.where(rng.random(size) < 0.6, refs, labels(rng, size, 3))
    # the module's cola config computes the multi-class (Gorodkin) coefficient
    result = metric("cola").compute(predictions=preds, references=refs)
    expected = matthews_corrcoef(refs, preds)
    assert result["matthews_correlation"] == pytest.approx(expected, abs=1e-12)


def test_matthews_with_class_missing_from_predictions() -> None:
    refs = np.array([0, 1, 2, 2, 1, 0, 2, 1], dtype=np.int64)
    preds = np.array([0, 1, 1, 1, 1, 0, 0, 1], dtype=np.int64)
    result = metric("cola").compute(predictions=preds, references=refs)
    assert result["matthews_correlation"] == pytest.approx(matthews_corrcoef(refs, preds),
                                                           abs=1e-12)


def test_perfect_and_inverted_matthews() -> None:
    refs = np.array([0, 1, 1, 0, 1, 0, 0, 1], dtype=np.int64)
    assert metric("cola").compute(predictions=refs, references=refs)[
        "matthews_correlation"] == pytest.approx(1.0)
    assert metric("cola").compute(predictions=1 - refs, references=refs)[
        "matthews_correlation"] == pytest.approx(-1.0)


@pytest.mark.parametrize("constant", [0, 1])
def test_matthews_of_constant_predictions_is_zero(constant: int) -> None:
    refs = np.array([0, 1, 1, 0, 1, 1, 1], dtype=np.int64)
    preds = np.full(len(refs), constant, dtype=np.int64)
    result = metric("cola").compute(predictions=preds, references=refs)
    assert result["matthews_correlation"] == 0.0
    assert matthews_corrcoef(refs, preds) == 0.0


def test_unknown_config_is_rejected() -> None:
    with pytest.raises(KeyError, match="unknown GLUE config"):
        evaluate.load(str(harness.data.metrics.METRIC_MODULE), "squad")


# --------------------------------------------------------------------------- regression


@pytest.mark.parametrize("size", SIZES)
def test_pearson_and_spearman_match_scipy(size: int) -> None:
    rng = np.random.default_rng(400 + size)
    # float32 values, as the module's stsb features are float32
    refs = rng.uniform(0, 5, size).astype(np.float32)
    preds = (refs + rng.normal(0, 1.5, size)).astype(np.float32)
    result = metric("stsb").compute(predictions=preds, references=refs)
    assert set(result) == {"pearson", "spearmanr"}
    x, y = preds.astype(np.float64), refs.astype(np.float64)
    assert result["pearson"] == pytest.approx(pearsonr(x, y)[0], abs=1e-9)
    assert result["spearmanr"] == pytest.approx(spearmanr(x, y)[0], abs=1e-9)


@pytest.mark.parametrize("size", SIZES)
def test_spearman_with_ties_matches_scipy(size: int) -> None:
    rng = np.random.default_rng(500 + size)
    refs = rng.integers(0, 6, size).astype(np.float32)  # GLUE-like 0..5 scores, many ties
    preds = np.round(refs + rng.normal(0, 1.0, size)).astype(np.float32)
    result = metric("stsb").compute(predictions=preds, references=refs)
    x, y = preds.astype(np.float64), refs.astype(np.float64)
    assert result["spearmanr"] == pytest.approx(spearmanr(x, y)[0], abs=1e-9)
    assert result["pearson"] == pytest.approx(pearsonr(x, y)[0], abs=1e-9)


def test_spearman_is_rank_based() -> None:
    refs = np.array([0.5, 1.0, 2.0, 3.5, 4.0], dtype=np.float32)
    preds = np.exp(refs * 3).astype(np.float32)  # monotone, far from linear
    result = metric("stsb").compute(predictions=preds, references=refs)
    assert result["spearmanr"] == pytest.approx(1.0)
    assert result["pearson"] < 0.99


def test_pearson_of_constant_predictions_is_nan() -> None:
    refs = np.array([0.0, 1.0, 2.0, 3.0], dtype=np.float32)
    result = metric("stsb").compute(predictions=np.full(4, 2.5, np.float32), references=refs)
    assert math.isnan(result["pearson"])


# --------------------------------------------------------------------------- TaskEvaluator


def test_regression_predictions_take_column_zero() -> None:
    evaluator = TaskEvaluator(get_task("stsb"))
    logits = np.array([[1.5, 9.0], [2.5, -9.0], [0.25, 7.0]], dtype=np.float32)
    np.testing.assert_array_equal(evaluator.predictions(logits), [1.5, 2.5, 0.25])
    np.testing.assert_array_equal(evaluator.predictions(logits[:, :1]), [1.5, 2.5, 0.25])


def test_classification_predictions_are_argmax() -> None:
    rng = np.random.default_rng(7)
    refs = labels(rng, 40, 3)
    logits = rng.normal(0, 1, (40, 3)).astype(np.float32)
    logits[np.arange(40), refs] += 10.0  # the winning class is the reference
    evaluator = TaskEvaluator(get_task("mnli"))
    np.testing.assert_array_equal(evaluator.predictions(logits), refs)
    assert evaluator.score(logits, refs) == {"accuracy": pytest.approx(100.0)}


def test_scores_are_on_0_100_scale() -> None:
    rng = np.random.default_rng(8)
    refs = labels(rng, 120, 2)
    chosen = np.where(rng.random(120) < 0.7, refs, 1 - refs)
    logits = np.stack([1.0 - chosen, chosen.astype(np.float64)], axis=1)
    scores = TaskEvaluator(get_task("mrpc")).score(logits, refs)
    assert list(scores) == ["f1", "accuracy"]
    assert scores["f1"] == pytest.approx(100 * f1_score(refs, chosen))
    assert scores["accuracy"] == pytest.approx(100 * accuracy_score(refs, chosen))

    cola = TaskEvaluator(get_task("cola")).score(logits, refs)
    assert cola["matthews_correlation"] == pytest.approx(100 * matthews_corrcoef(refs, chosen))


def test_regression_scores_on_0_100_scale() -> None:
    rng = np.random.default_rng(9)
    refs = rng.uniform(0, 5, 80).astype(np.float32)
    preds = (refs + rng.normal(0, 1, 80)).astype(np.float32)
    scores = TaskEvaluator(get_task("stsb")).score(preds[:, None], refs)
    x, y = preds.astype(np.float64), refs.astype(np.float64)
    assert scores["pearson"] == pytest.approx(100 * pearsonr(x, y)[0], abs=1e-6)
    assert scores["spearmanr"] == pytest.approx(100 * spearmanr(x, y)[0], abs=1e-6)


def test_baseline_predicts_majority_class() -> None:
    rng = np.random.default_rng(10)
    train = np.array([1] * 60 + [0] * 40 + [-1] * 70, dtype=np.int64)  # -1: unlabelled
    refs = labels(rng, 50, 2)
    ones = np.ones(len(refs), dtype=np.int64)
    baseline = TaskEvaluator(get_task("mrpc")).baseline(train, refs)
    assert baseline["f1"] == pytest.approx(100 * f1_score(refs, ones))
    assert baseline["accuracy"] == pytest.approx(100 * accuracy_score(refs, ones))
    assert baseline["f1"] > 0


def test_baseline_for_majority_class_zero() -> None:
    refs = np.array([0, 1, 1, 0, 1], dtype=np.int64)
    baseline = TaskEvaluator(get_task("sst2")).baseline(np.array([0, 0, 1]), refs)
    assert baseline["accuracy"] == pytest.approx(100 * accuracy_score(refs, np.zeros(5)))


def test_constant_baseline_matthews_is_zero() -> None:
    refs = np.array([0, 1, 1, 0, 1], dtype=np.int64)
    baseline = TaskEvaluator(get_task("cola")).baseline(np.array([1, 1, 0]), refs)
    assert baseline == {"matthews_correlation": 0.0}


def test_nan_pearson_is_reported_as_zero() -> None:
    refs = np.array([0.5, 1.0, 4.0, 3.0, 2.0], dtype=np.float32)
    train = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    evaluator = TaskEvaluator(get_task("stsb"))
    assert evaluator.baseline(train, refs) == {"pearson": 0.0, "spearmanr": 0.0}
    constant_logits = np.full((5, 1), 2.0, dtype=np.float32)
    assert evaluator.score(constant_logits, refs) == {"pearson": 0.0, "spearmanr": 0.0}


@pytest.mark.parametrize("task", ["stsb", "sst2"])
def test_non_finite_predictions_are_refused_not_scored(task: str) -> None:
    """A diverged model's NaN outputs used to score 0 Pearson (a NaN correlation read as no
    skill): a plausible number from broken input.  Only a constant prediction is scored 0."""
    evaluator = TaskEvaluator(get_task(task))
    refs = (np.array([0.5, 1.0, 4.0, 3.0, 2.0], dtype=np.float32) if task == "stsb"
            else np.array([0, 1, 1, 0, 1]))
    logits = np.random.default_rng(0).normal(size=(5, 1 if task == "stsb" else 2))
    logits[2, 0] = np.nan
    with pytest.raises(ValueError, match=r"1 of 5 predictions are not finite"):
        evaluator.score_predictions(logits[:, 0], refs)
    if task == "stsb":
        with pytest.raises(ValueError, match="not finite"):
            evaluator.score(logits, refs)

"""Tests for harness.reporting.comparisons, each against a hand computation on tiny arrays."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task
from harness.reporting.comparisons import (
    SeedDifference,
    aggregate,
    bootstrap_non_inferiority,
    holm,
    interquartile_mean,
    metric_rows,
    minimum_detectable_difference,
    non_inferiority,
    per_task_difference,
    predictions_from_logits,
    probability_of_improvement,
    share_of_teacher_margin,
    two_level_bootstrap,
    verdict,
)

# --------------------------------------------------------------------------- task metrics


@pytest.mark.parametrize(("task", "metric", "classes"), [
    ("rte", "accuracy", 2), ("mrpc", "f1", 2), ("mrpc", "accuracy", 2),
    ("cola", "matthews_correlation", 2), ("mnli", "accuracy", 3)])
def test_metric_rows_equal_the_task_evaluator_on_classification(task, metric, classes):
    rng = np.random.default_rng(3)
    evaluator = TaskEvaluator(get_task(task))
    references = rng.integers(0, classes, size=40)
    predictions = rng.integers(0, classes, size=(6, 40))
    predictions[0] = 1  # a constant prediction: MCC 0, F1 defined
    predictions[1] = references  # perfect
    expected = [evaluator.score_predictions(row, references)[metric] for row in predictions]
    np.testing.assert_allclose(metric_rows(metric, predictions, references), expected,
                               rtol=0, atol=1e-10)


def test_matthews_rows_equal_the_evaluator_with_three_classes():
    rng = np.random.default_rng(4)
    references = rng.integers(0, 3, size=30)
    predictions = rng.integers(0, 3, size=(5, 30))
    evaluator = TaskEvaluator(get_task("cola"))  # the formula is Gorodkin's R_K for any K
    expected = [evaluator.score_predictions(row, references)["matthews_correlation"]
                for row in predictions]
    np.testing.assert_allclose(metric_rows("matthews_correlation", predictions, references),
                               expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("metric", ["pearson", "spearmanr"])
def test_metric_rows_equal_the_task_evaluator_on_regression(metric):
    rng = np.random.default_rng(5)
    evaluator = TaskEvaluator(get_task("stsb"))
    references = np.round(rng.uniform(0, 5, size=25), 1)  # ties, as STS-B has
    predictions = references + rng.normal(0, 1, size=(4, 25))
    predictions[0] = 2.5  # constant: scored 0
    predictions[1] = np.round(predictions[1])  # ties among predictions
    # the evaluator's features are float32: compare on values float32 holds exactly
    predictions, references = predictions.astype(np.float32), references.astype(np.float32)
    expected = [evaluator.score_predictions(row, references)[metric] for row in predictions]
    np.testing.assert_allclose(metric_rows(metric, predictions, references), expected,
                               rtol=0, atol=1e-9)


def test_metric_rows_names_an_unknown_metric():
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        metric_rows("bleu", np.zeros((1, 3)), np.zeros(3))


def test_predictions_from_logits_argmax_and_regression():
    logits = np.array([[[0.1, 0.9], [2.0, -1.0]]])
    np.testing.assert_array_equal(predictions_from_logits(logits), [[1, 0]])
    np.testing.assert_array_equal(predictions_from_logits(np.array([[[0.3], [4.2]]])),
                                  [[0.3, 4.2]])


# --------------------------------------------------------------------------- over seeds


def test_per_task_difference_is_the_paired_t_interval():
    a, b = [80.0, 82.0, 85.0], [78.0, 81.0, 80.0]
    d = np.array(a) - np.array(b)  # 2, 1, 5
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    result = per_task_difference(a, b)
    assert result.estimate == pytest.approx(8 / 3)
    assert result.sd == pytest.approx(math.sqrt(((2 - 8 / 3) ** 2 + (1 - 8 / 3) ** 2
                                                 + (5 - 8 / 3) ** 2) / 2))
    assert (result.low, result.high) == pytest.approx((8 / 3 - half, 8 / 3 + half))
    t_value = (8 / 3) / (d.std(ddof=1) / math.sqrt(3))
    assert result.pvalue == pytest.approx(2 * stats.t.sf(t_value, 2))
    assert not result.zero_variance


def test_per_task_difference_flags_zero_variance_instead_of_certainty():
    result = per_task_difference([82.9, 82.9, 82.9], [81.0, 81.0, 81.0])
    assert result.zero_variance
    assert result.estimate == pytest.approx(1.9)
    assert math.isnan(result.low) and math.isnan(result.high) and math.isnan(result.pvalue)


def test_per_task_difference_needs_paired_seeds():
    with pytest.raises(ValueError, match="paired seeds"):
        per_task_difference([1.0, 2.0], [1.0, 2.0, 3.0])


# --------------------------------------------------------------------------- two-level bootstrap


def _hand_two_level(logits_a, logits_b, labels, metric, resamples, seed, task):
    """The two-level bootstrap written as a plain loop over the task evaluator."""
    evaluator = TaskEvaluator(get_task(task))
    rng = np.random.default_rng(seed)
    n_seeds, n_examples = logits_a.shape[:2]
    differences, improvement = [], []
    for _ in range(resamples):
        seeds = rng.integers(0, n_seeds, size=n_seeds)
        examples = rng.integers(0, n_examples, size=n_examples)
        a = [evaluator.score(logits_a[s][examples], labels[examples])[metric]
             for s in range(n_seeds)]
        b = [evaluator.score(logits_b[s][examples], labels[examples])[metric]
             for s in range(n_seeds)]
        differences.append(np.mean([a[s] - b[s] for s in seeds]))
        wins = [1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b]
        improvement.append(sum(wins) / len(wins))
    differences = np.array(differences)
    below = (sum(d <= 0 for d in differences) + 1) / (resamples + 1)
    above = (sum(d >= 0 for d in differences) + 1) / (resamples + 1)
    full = [evaluator.score(logits_a[s], labels)[metric]
            - evaluator.score(logits_b[s], labels)[metric] for s in range(n_seeds)]
    return {"estimate": np.mean(full), "differences": differences,
            "interval": np.percentile(differences, [50 * (1 - 0.95), 50 * (1 + 0.95)]),
            "p": min(1.0, 2 * min(below, above)), "poi": np.mean(improvement)}


def _tiny_records(rng: np.random.Generator, n_seeds: int = 3, n_examples: int = 12):
    """Two methods' dev logits shaped like predictions files: (seeds, examples, classes)."""
    labels = rng.integers(0, 2, size=n_examples)
    logits_a = rng.normal(size=(n_seeds, n_examples, 2))
    logits_a[..., 1] += 1.2 * (2 * labels - 1)  # A leans towards the right class
    logits_b = rng.normal(size=(n_seeds, n_examples, 2))
    return logits_a, logits_b, labels


@pytest.mark.slow
@pytest.mark.parametrize(("task", "metric"), [("rte", "accuracy"), ("mrpc", "f1")])
def test_two_level_bootstrap_equals_a_hand_loop_over_two_tiny_records(task, metric):
    logits_a, logits_b, labels = _tiny_records(np.random.default_rng(11))
    result = two_level_bootstrap(logits_a, logits_b, labels, metric, resamples=200, seed=7)
    hand = _hand_two_level(logits_a, logits_b, labels, metric, 200, 7, task)
    assert result.estimate == hand["estimate"]
    np.testing.assert_array_equal(result.differences, hand["differences"])
    assert (result.low, result.high) == tuple(hand["interval"])
    assert result.pvalue == hand["p"]
    assert result.probability_of_improvement == hand["poi"]
    assert result.se == float(np.std(hand["differences"], ddof=1))


def test_two_level_bootstrap_strictly_better_everywhere():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=30)
    correct = np.tile(labels, (3, 1))
    wrong = correct.copy()
    wrong[:, ::3] = 1 - wrong[:, ::3]  # B misses every third example, A none
    result = two_level_bootstrap(correct, wrong, labels, "accuracy", resamples=500, seed=1)
    assert result.low > 0
    assert result.pvalue == pytest.approx(2 / 501)
    assert result.probability_of_improvement == pytest.approx(1.0)


def test_two_level_bootstrap_null_case_is_not_significant():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 2, size=200)
    pred_a = np.where(rng.random((3, 200)) < 0.7, labels, 1 - labels)
    pred_b = np.where(rng.random((3, 200)) < 0.7, labels, 1 - labels)
    result = two_level_bootstrap(pred_a, pred_b, labels, "accuracy", resamples=1000, seed=3)
    assert result.low < 0 < result.high
    assert result.pvalue > 0.2
    assert 0.25 < result.probability_of_improvement < 0.75


def test_two_level_bootstrap_checks_shapes():
    with pytest.raises(ValueError, match="must share"):
        two_level_bootstrap(np.zeros((3, 5)), np.zeros((2, 5)), np.zeros(5), "accuracy")


def test_minimum_detectable_difference_is_2_8_standard_errors():
    expected = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * 1.5
    assert minimum_detectable_difference(1.5) == pytest.approx(expected)
    assert minimum_detectable_difference(1.5) == pytest.approx(2.8 * 1.5, abs=0.01)


# --------------------------------------------------------------------------- across tasks


def test_share_of_teacher_margin_by_hand_and_flags():
    share, flagged = share_of_teacher_margin([60.0, 70.0], [50.0, 68.0], [80.0, 71.0],
                                             min_margin=5.0)
    np.testing.assert_allclose(share, [10 / 30, 2 / 3])
    np.testing.assert_array_equal(flagged, [False, True])
    share, flagged = share_of_teacher_margin(60.0, 70.0, 65.0)  # teacher below its baseline
    assert math.isnan(float(share)) and bool(flagged)
    share, flagged = share_of_teacher_margin(60.0, 50.0, math.nan)  # no teacher score
    assert math.isnan(float(share)) and bool(flagged)


def test_interquartile_mean_of_one_to_eight():
    # rliable: the mean of the middle 50% of the scores, 25% trimmed on each side
    assert interquartile_mean(np.arange(1, 9)) == pytest.approx((3 + 4 + 5 + 6) / 4)
    assert interquartile_mean(np.array([8, 1, 7, 2, 6, 3, 5, 4])) == pytest.approx(4.5)


def _shares(runs_per_task: int, rng: np.random.Generator, method: str = "m") -> pd.DataFrame:
    centres = {"cola": 0.3, "mrpc": 0.9, "rte": 0.1, "sst2": 0.6, "stsb": 0.5}
    return pd.DataFrame([{"method": method, "task": task, "seed": seed,
                          "share": centre + rng.normal(0, 0.2)}
                         for task, centre in centres.items() for seed in range(runs_per_task)])


def test_aggregate_point_estimates_by_hand_and_interval_contains_them():
    shares = _shares(3, np.random.default_rng(0))
    row = aggregate(shares, resamples=2000, seed=0).iloc[0]
    values = shares["share"].to_numpy()
    assert row["mean"] == pytest.approx(values.mean())
    kept = np.sort(values)[3:12]  # 15 values: 3 trimmed on each side
    assert row["iqm"] == pytest.approx(kept.mean())
    assert row["mean_low"] <= row["mean"] <= row["mean_high"]
    assert row["iqm_low"] <= row["iqm"] <= row["iqm_high"]
    assert (row["tasks"], row["runs"]) == (5, 15)


def test_aggregate_interval_shrinks_with_more_runs():
    few = aggregate(_shares(5, np.random.default_rng(1)), resamples=2000).iloc[0]
    many = aggregate(_shares(100, np.random.default_rng(1)), resamples=2000).iloc[0]
    assert many["mean_high"] - many["mean_low"] < 0.5 * (few["mean_high"] - few["mean_low"])
    assert many["iqm_high"] - many["iqm_low"] < 0.5 * (few["iqm_high"] - few["iqm_low"])


def test_aggregate_resamples_within_each_task():
    # runs are equal within each task: a task-stratified bootstrap never changes the mean,
    # a bootstrap that pooled the tasks would
    shares = pd.DataFrame([{"method": "m", "task": task, "seed": seed, "share": value}
                           for task, value in (("a", 0.0), ("b", 1.0)) for seed in range(4)])
    row = aggregate(shares, resamples=500).iloc[0]
    assert row["mean_low"] == row["mean_high"] == pytest.approx(0.5)


def test_aggregate_without_flagged_tasks():
    shares = _shares(3, np.random.default_rng(2))
    table = aggregate(shares, flagged=["mrpc"], resamples=500)
    assert list(table["scope"]) == ["all tasks", "without flagged"]
    without = table.iloc[1]
    assert without["tasks"] == 4
    assert without["mean"] == pytest.approx(
        shares.loc[shares["task"] != "mrpc", "share"].mean())


def test_probability_of_improvement_by_hand():
    shares = pd.DataFrame([
        *({"method": "a", "task": "t1", "seed": i, "share": v} for i, v in enumerate([3, 5])),
        *({"method": "b", "task": "t1", "seed": i, "share": v} for i, v in enumerate([4, 5])),
        *({"method": "a", "task": "t2", "seed": i, "share": v} for i, v in enumerate([9, 9])),
        *({"method": "b", "task": "t2", "seed": i, "share": v} for i, v in enumerate([1, 2])),
    ])
    # t1: pairs (3,4) 0, (3,5) 0, (5,4) 1, (5,5) 0.5 -> 1.5 / 4; t2: 1
    assert probability_of_improvement(shares, "a", "b") == pytest.approx((1.5 / 4 + 1) / 2)


# --------------------------------------------------------------------------- families, verdicts


def test_holm_by_hand_keeps_the_family():
    table = holm("paper orderings", {"x": 0.01, "y": 0.04, "z": 0.03, "w": math.nan})
    # sorted 0.01, 0.03, 0.04 over m = 3: 0.03, max(0.03, 0.06), max(0.06, 0.04)
    np.testing.assert_allclose(table["p_holm"].iloc[:3], [0.03, 0.06, 0.06])
    assert math.isnan(table["p_holm"].iloc[3])
    assert set(table["family"]) == {"paper orderings"}
    assert list(table["comparison"]) == ["x", "y", "z", "w"]


def test_non_inferiority_by_hand():
    d = np.array([-0.5, 0.2, -0.1, 0.4])
    result = non_inferiority(d, margin=1.0)
    t_value = (d.mean() + 1.0) / (d.std(ddof=1) / 2)
    assert result.pvalue == pytest.approx(stats.t.sf(t_value, 3))
    assert result.lower_bound == pytest.approx(
        d.mean() - stats.t.ppf(0.95, 3) * d.std(ddof=1) / 2)
    assert result.non_inferior
    assert not non_inferiority(d, margin=0.0).non_inferior  # no margin: not shown equal
    with pytest.raises(ValueError, match="margin"):
        non_inferiority(d, margin=-1.0)


def test_bootstrap_non_inferiority_counts_resamples_below_the_margin():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=50)
    pred = np.tile(labels, (3, 1))
    result = two_level_bootstrap(pred, pred, labels, "accuracy", resamples=300, seed=0)
    test = bootstrap_non_inferiority(result, margin=1.0)  # identical methods, A - B = 0
    assert test.pvalue == pytest.approx(1 / 301) and test.non_inferior


def test_verdict_names_wins_losses_and_ties():
    per_task = {"stsb": SeedDifference(26.2, 17.0, 35.5, 0.01, 3.0, 3, False),
                "rte": SeedDifference(-2.4, -3.1, -1.7, 0.01, 0.3, 3, False),
                "cola": SeedDifference(0.5, -1.0, 2.0, 0.4, 0.6, 3, False),
                "sst2": SeedDifference(0.0, math.nan, math.nan, math.nan, 0.0, 3, True)}
    assert verdict(per_task, "tinybert", "kd") == (
        "tinybert - kd: wins on stsb (+26.2 [+17.0, +35.5]); loses on rte (-2.4 [-3.1, -1.7]); "
        "ties on cola; no interval on sst2")


def test_aggregate_intervals_match_rliables_stratified_bootstrap_written_out():
    # rliable (Agarwal et al. 2021): a score matrix of runs x tasks; each resample draws the
    # runs of every task with replacement, independently per task, and the interval is the
    # percentile interval of the statistic over all resampled scores
    rng = np.random.default_rng(0)
    scores = rng.normal(0.5, 0.3, size=(5, 4))  # runs x tasks
    shares = pd.DataFrame([{"method": "m", "task": f"t{t}", "seed": r, "share": scores[r, t]}
                           for r in range(5) for t in range(4)])
    runs = np.random.default_rng(1).integers(0, 5, size=(20_000, 5, 4))  # per task column
    resampled = scores[runs, np.arange(4)].reshape(20_000, -1)
    means = resampled.mean(axis=1)
    iqms = stats.trim_mean(resampled, 0.25, axis=1)
    row = aggregate(shares, resamples=20_000, seed=2).iloc[0]
    assert row["iqm"] == pytest.approx(stats.trim_mean(scores.ravel(), 0.25))
    np.testing.assert_allclose([row["mean_low"], row["mean_high"]],
                               np.percentile(means, [2.5, 97.5]), atol=0.01)
    np.testing.assert_allclose([row["iqm_low"], row["iqm_high"]],
                               np.percentile(iqms, [2.5, 97.5]), atol=0.01)

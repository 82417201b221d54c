"""Statistics for comparing methods per task and across tasks (protocol v3).

Per task, two methods A and B are compared on paired seeds (A's seed s against B's seed s):

- `per_task_difference(a, b)`: the mean of the per-seed differences A - B with its Student-t
  interval (ddof 1) and the paired t-test; a difference that does not vary over seeds is
  flagged, its interval left undefined.
- `two_level_bootstrap(pred_a, pred_b, labels, metric)`: resamples both the seeds and the dev
  examples from the per-example predictions, recomputes the task metric on each side and gives
  the mean difference's percentile interval, a two-sided bootstrap p-value and the probability
  of improvement; `minimum_detectable_difference` turns its standard error into the smallest
  difference the design could have detected.

Across tasks, scores are put on one scale first:

- `share_of_teacher_margin(score, baseline, teacher)`: (score - baseline) / (teacher - baseline),
  with tasks whose teacher is barely above the baseline flagged;
- `aggregate(shares)`: per method, the mean and the interquartile mean (IQM) of the shares with
  task-stratified bootstrap intervals (the protocol of Agarwal et al. 2021, package `rliable`),
  also without the flagged tasks; `probability_of_improvement` across tasks as rliable defines it.

Claims read together form one family: `holm` adjusts their p-values within it, and a "≥" claim
is tested with `non_inferiority` at a stated margin. `verdict` says on which tasks A wins, loses
or ties. Scores are in the suite's points (metric x 100) unless a function says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd
from scipy import stats

from harness.reporting.stats import holm_adjust

METRICS = ("accuracy", "f1", "matthews_correlation", "pearson", "spearmanr")
_CHUNK_ELEMENTS = 4_000_000  # resamples x seeds x examples scored at once
IQM_TRIM = 0.25  # the interquartile mean drops 25% of the values on each side


# --- task metrics, vectorised over rows ------------------------------------------------------

def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator == 0, np.nan, (x * y).sum(axis=-1) / denominator)


def _matthews_rows(predictions: np.ndarray, references: np.ndarray) -> np.ndarray:
    """Multi-class Matthews correlation (Gorodkin's R_K) of each row, 0 where undefined."""
    classes, codes = np.unique(np.concatenate([predictions.ravel(), references.ravel()]),
                               return_inverse=True)
    k = len(classes)
    pred_codes = codes[: predictions.size].reshape(predictions.shape)
    ref_codes = codes[predictions.size:].reshape(references.shape)
    rows = pred_codes.reshape(-1, pred_codes.shape[-1]).shape[0]
    flat = (np.arange(rows)[:, None] * k * k + ref_codes.reshape(rows, -1) * k
            + pred_codes.reshape(rows, -1))
    confusion = np.bincount(flat.ravel(), minlength=rows * k * k).reshape(rows, k, k)
    confusion = confusion.astype(np.float64)
    total = confusion.sum(axis=(1, 2))
    correct = np.trace(confusion, axis1=1, axis2=2)
    true_counts = confusion.sum(axis=2)
    pred_counts = confusion.sum(axis=1)
    covariance = correct * total - (true_counts * pred_counts).sum(axis=1)
    denominator = (np.sqrt(total**2 - (pred_counts**2).sum(axis=1))
                   * np.sqrt(total**2 - (true_counts**2).sum(axis=1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(denominator == 0, 0.0, covariance / denominator)
    return value.reshape(predictions.shape[:-1])


def metric_rows(metric: str, predictions: np.ndarray, references: np.ndarray) -> np.ndarray:
    """The task metric of every row (last axis = examples), on the 0-100 scale.

    The same formulas as `harness.data.metrics.TaskEvaluator.score_predictions` (accuracy,
    binary F1 of class 1, multi-class Matthews correlation, Pearson, Spearman with average
    ranks), computed for many rows at once; a correlation with a constant is scored 0, as there.
    `references` broadcasts against `predictions`.
    """
    predictions = np.asarray(predictions)
    references = np.broadcast_to(np.asarray(references), predictions.shape)
    if metric == "accuracy":
        value = (predictions == references).mean(axis=-1)
    elif metric == "f1":
        true_pos = ((predictions == 1) & (references == 1)).sum(axis=-1)
        wrong = ((predictions == 1) != (references == 1)).sum(axis=-1)
        denominator = 2 * true_pos + wrong
        value = np.where(denominator == 0, 0.0, 2 * true_pos / np.maximum(denominator, 1))
    elif metric == "matthews_correlation":
        value = _matthews_rows(predictions, references)
    elif metric in ("pearson", "spearmanr"):
        x, y = predictions.astype(np.float64), references.astype(np.float64)
        if metric == "spearmanr":
            x, y = stats.rankdata(x, axis=-1), stats.rankdata(y, axis=-1)
        value = np.nan_to_num(_pearson_rows(x, y), nan=0.0)
    else:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return 100.0 * np.asarray(value, dtype=np.float64)


def predictions_from_logits(logits: np.ndarray) -> np.ndarray:
    """Class predictions (argmax of the last axis) from logits of shape (..., examples, classes);
    a last axis of size 1 is a regression score and is returned as it is."""
    logits = np.asarray(logits)
    if logits.shape[-1] == 1:
        return logits[..., 0]
    return logits.argmax(axis=-1)


# --- per task, over seeds --------------------------------------------------------------------

@dataclass(frozen=True)
class SeedDifference:
    """Mean per-seed difference A - B on one task with its Student-t interval."""

    estimate: float
    low: float
    high: float
    pvalue: float
    sd: float
    n: int
    zero_variance: bool


def per_task_difference(a_scores: Sequence[float] | np.ndarray,
                        b_scores: Sequence[float] | np.ndarray, *,
                        confidence: float = 0.95) -> SeedDifference:
    """Mean of the paired differences a[s] - b[s] over seeds, with the t interval
    mean +- t(n-1) * sd / sqrt(n) (sd with ddof 1) and the paired t-test's two-sided p.

    The two arrays are paired by position (seed). When every difference is the same the
    interval is not a certainty: `zero_variance` is set and low, high and p are NaN (as they
    are with fewer than two seeds).
    """
    a = np.asarray(a_scores, dtype=float)
    b = np.asarray(b_scores, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired seeds needed: got shapes {a.shape} and {b.shape}")
    differences = a - b
    n = differences.size
    estimate = float(differences.mean()) if n else math.nan
    sd = float(differences.std(ddof=1)) if n > 1 else math.nan
    zero_variance = n > 1 and sd == 0.0
    if n < 2 or zero_variance:
        return SeedDifference(estimate, math.nan, math.nan, math.nan, sd, n, zero_variance)
    test = stats.ttest_rel(a, b)
    interval = test.confidence_interval(confidence_level=confidence)
    return SeedDifference(estimate, float(interval.low), float(interval.high),
                          float(test.pvalue), sd, n, False)


# --- per task, over seeds and dev examples ---------------------------------------------------

@dataclass(frozen=True)
class TwoLevelResult:
    """A two-level bootstrap comparison A - B on one task (see `two_level_bootstrap`)."""

    estimate: float
    low: float
    high: float
    pvalue: float
    probability_of_improvement: float
    se: float
    differences: np.ndarray  # the resampled mean differences, one per resample


def _resample_scores(pred: np.ndarray, labels: np.ndarray, metric: str,
                     examples: np.ndarray) -> np.ndarray:
    """Metric of every seed's predictions on each resampled example set: (resamples, seeds)."""
    picked = pred[:, examples]  # (seeds, resamples, n)
    return metric_rows(metric, picked, labels[examples][None]).T


def _draw(rng: np.random.Generator, resamples: int, n_seeds: int,
          n_examples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per resample, in order: seed indices rng.integers(0, S, S), then example indices
    rng.integers(0, n, n); returned stacked as (resamples, S) and (resamples, n)."""
    seeds = np.empty((resamples, n_seeds), dtype=np.int64)
    examples = np.empty((resamples, n_examples), dtype=np.int64)
    for r in range(resamples):
        seeds[r] = rng.integers(0, n_seeds, size=n_seeds)
        examples[r] = rng.integers(0, n_examples, size=n_examples)
    return seeds, examples


def _mann_whitney(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """P(a_i > b_j) + 0.5 P(a_i = b_j) over all pairs of the last axis, per leading row."""
    greater = (a[..., :, None] > b[..., None, :]).mean(axis=(-2, -1))
    equal = (a[..., :, None] == b[..., None, :]).mean(axis=(-2, -1))
    return greater + 0.5 * equal


def bootstrap_pvalue(differences: np.ndarray) -> float:
    """Two-sided p of the percentile bootstrap: twice the smaller share of resampled
    differences at or below 0 and at or above 0, each counted as (count + 1) / (R + 1), capped
    at 1. It is below alpha about when the 1 - alpha percentile interval excludes 0."""
    resamples = differences.size
    below = (np.count_nonzero(differences <= 0) + 1) / (resamples + 1)
    above = (np.count_nonzero(differences >= 0) + 1) / (resamples + 1)
    return float(min(1.0, 2.0 * min(below, above)))


def _as_predictions(pred: np.ndarray, name: str) -> np.ndarray:
    pred = np.asarray(pred)
    if pred.ndim == 3:
        pred = predictions_from_logits(pred)
    if pred.ndim != 2:
        raise ValueError(f"{name}: expected (seeds, examples) predictions or (seeds, examples, "
                         f"classes) logits, got shape {pred.shape}")
    return pred


def two_level_bootstrap(pred_a: np.ndarray, pred_b: np.ndarray, labels: np.ndarray,
                        metric: str, *, resamples: int = 10_000, seed: int = 0,
                        confidence: float = 0.95) -> TwoLevelResult:
    """Paired comparison A - B on one task that resamples both seeds and dev examples.

    `pred_a` and `pred_b` hold each seed's dev predictions, (seeds, examples), or logits,
    (seeds, examples, classes; a last axis of 1 is a regression score); seed s of A is paired
    with seed s of B, and example i is the same dev example in both. The estimate is the mean
    over seeds of metric(A_s) - metric(B_s). For each resample, with
    ``rng = np.random.default_rng(seed)`` and in this order, seed indices are drawn with
    replacement (``rng.integers(0, S, S)``, the same pairs for A and B) and then example
    indices (``rng.integers(0, n, n)``, the same examples for A and B and for every seed);
    the metric is recomputed on each drawn seed's predictions and the mean difference kept.

    Returned: the percentile interval of the resampled differences (their 50 (1 - confidence)
    and 50 (1 + confidence) percentiles, ``np.percentile``), the two-sided p of
    `bootstrap_pvalue`, their standard deviation (ddof 1) as the standard error, and the
    probability of improvement: P(A_i > B_j) + 0.5 P(A_i = B_j) over all pairs of A's and B's
    seeds, each scored on the resampled examples, averaged over the resamples.
    """
    a = _as_predictions(pred_a, "pred_a")
    b = _as_predictions(pred_b, "pred_b")
    labels = np.asarray(labels)
    if a.shape != b.shape or a.shape[1] != labels.shape[0]:
        raise ValueError(f"A {a.shape}, B {b.shape} and labels {labels.shape} must share "
                         "(seeds, examples)")
    n_seeds, n_examples = a.shape
    estimate = float((metric_rows(metric, a, labels) - metric_rows(metric, b, labels)).mean())
    seed_index, example_index = _draw(np.random.default_rng(seed), resamples, n_seeds,
                                      n_examples)
    differences = np.empty(resamples)
    improvement = np.empty(resamples)
    block = max(1, _CHUNK_ELEMENTS // (n_seeds * n_examples))
    for start in range(0, resamples, block):
        rows = slice(start, min(resamples, start + block))
        scores_a = _resample_scores(a, labels, metric, example_index[rows])
        scores_b = _resample_scores(b, labels, metric, example_index[rows])
        drawn = seed_index[rows]
        differences[rows] = (np.take_along_axis(scores_a, drawn, axis=1)
                             - np.take_along_axis(scores_b, drawn, axis=1)).mean(axis=1)
        improvement[rows] = _mann_whitney(scores_a, scores_b)
    low, high = np.percentile(differences, [50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)])
    se = float(differences.std(ddof=1)) if resamples > 1 else math.nan
    return TwoLevelResult(estimate, float(low), float(high), bootstrap_pvalue(differences),
                          float(improvement.mean()), se, differences)


def minimum_detectable_difference(se: float, *, alpha: float = 0.05,
                                  power: float = 0.8) -> float:
    """The smallest true difference a two-sided test at `alpha` would detect with probability
    `power`, given the difference's standard error: (z(1 - alpha/2) + z(power)) * se, which is
    2.80 x se at alpha 0.05 and 80% power (normal approximation). Pass
    `TwoLevelResult.se` to account for both the seeds and the dev examples."""
    return float((stats.norm.ppf(1.0 - alpha / 2.0) + stats.norm.ppf(power)) * se)


# --- across tasks ----------------------------------------------------------------------------

MIN_TEACHER_MARGIN = 5.0  # points: a teacher less far above its baseline gives unstable shares


def share_of_teacher_margin(score: float | np.ndarray, baseline: float | np.ndarray,
                            teacher: float | np.ndarray, *,
                            min_margin: float = MIN_TEACHER_MARGIN
                            ) -> tuple[np.ndarray, np.ndarray]:
    """(score - baseline) / (teacher - baseline) and whether the task is flagged.

    0 is the majority-class (or mean-score) baseline, 1 the teacher. A task is flagged when
    its teacher is less than `min_margin` points above the baseline: its shares divide by a
    small, noisy margin. Where the teacher is not above the baseline the share is NaN.
    Arguments broadcast; both results are arrays (0-d for scalars).
    """
    score, baseline, teacher = (np.asarray(v, dtype=float) for v in (score, baseline, teacher))
    margin = teacher - baseline
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(margin > 0, (score - baseline) / margin, np.nan)
    flagged = np.broadcast_to(~(margin >= min_margin), share.shape)  # NaN margins too
    return share, np.asarray(flagged)


def interquartile_mean(values: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """Mean of the middle 50% of the values: 25% trimmed on each side (rliable's IQM, which is
    ``scipy.stats.trim_mean(values, 0.25)``)."""
    return stats.trim_mean(values, IQM_TRIM, axis=axis)


def _stratified_interval(groups: list[np.ndarray], statistic: Callable[..., np.ndarray], *,
                         resamples: int, rng: np.random.Generator,
                         confidence: float) -> tuple[float, float]:
    """Percentile interval of `statistic` over all values when each group (task) is resampled
    with replacement on its own; groups of one value are constant under resampling."""
    varying = [g for g in groups if g.size > 1]
    fixed = np.concatenate([g for g in groups if g.size <= 1] + [np.empty(0)])
    if not varying:
        value = float(statistic(fixed))
        return value, value

    def pooled(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        shape = samples[0].shape[:-1] + fixed.shape
        values = np.concatenate([*samples, np.broadcast_to(fixed, shape)], axis=-1)
        return statistic(values, axis=-1)

    result = stats.bootstrap(tuple(varying), pooled, n_resamples=resamples, vectorized=True,
                             paired=False, confidence_level=confidence, method="percentile",
                             rng=rng)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _aggregate_one(frame: pd.DataFrame, *, resamples: int, seed: int,
                   confidence: float) -> dict[str, float]:
    groups = [g["share"].to_numpy(dtype=float) for _, g in frame.groupby("task", sort=True)]
    values = np.concatenate(groups)
    row: dict[str, float] = {"tasks": len(groups), "runs": values.size}
    for name, statistic in (("mean", np.mean), ("iqm", interquartile_mean)):
        low, high = _stratified_interval(groups, statistic, resamples=resamples,
                                         rng=np.random.default_rng(seed),
                                         confidence=confidence)
        row.update({name: float(statistic(values)), f"{name}_low": low, f"{name}_high": high})
    return row


def aggregate(shares: pd.DataFrame, *, flagged: Sequence[str] = (), resamples: int = 10_000,
              seed: int = 0, confidence: float = 0.95) -> pd.DataFrame:
    """Per method, the mean and the IQM of its runs' shares over all (task, seed) runs, each
    with a task-stratified percentile-bootstrap interval (runs resampled within each task,
    ``scipy.stats.bootstrap`` with one sample per task), as rliable computes them.

    `shares` has columns ``method``, ``task``, ``seed``, ``share`` (see
    `share_of_teacher_margin`); runs with a NaN share are left out. One row per method and
    scope: ``all tasks``, and ``without flagged`` when `flagged` names tasks present.
    """
    missing = {"method", "task", "seed", "share"} - set(shares.columns)
    if missing:
        raise ValueError(f"shares lacks column(s) {', '.join(sorted(missing))}")
    data = shares[np.isfinite(shares["share"].to_numpy(dtype=float))]
    scopes = {"all tasks": data}
    if set(flagged) & set(data["task"]):
        scopes["without flagged"] = data[~data["task"].isin(list(flagged))]
    rows = []
    for scope, frame in scopes.items():
        for method, runs in frame.groupby("method", sort=True):
            stats_row = _aggregate_one(runs, resamples=resamples, seed=seed,
                                       confidence=confidence)
            rows.append({"method": method, "scope": scope, **stats_row})
    return pd.DataFrame(rows)


def probability_of_improvement(shares: pd.DataFrame, method_a: str, method_b: str) -> float:
    """rliable's probability of improvement of A over B: per task, P(X > Y) + 0.5 P(X = Y)
    over all pairs of A's runs X and B's runs Y (the Mann-Whitney U statistic / (n m)),
    averaged over the tasks both have."""
    a = shares[shares["method"] == method_a]
    b = shares[shares["method"] == method_b]
    tasks = sorted(set(a["task"]) & set(b["task"]))
    if not tasks:
        return math.nan
    per_task = [_mann_whitney(a.loc[a["task"] == t, "share"].to_numpy(dtype=float),
                              b.loc[b["task"] == t, "share"].to_numpy(dtype=float))
                for t in tasks]
    return float(np.mean(per_task))


# --- families of claims, non-inferiority, verdicts -------------------------------------------

def holm(family: str, pvalues: Mapping[str, float]) -> pd.DataFrame:
    """Holm step-down adjustment of one family of claims read together.

    `pvalues` maps each comparison's name to its unadjusted p. Returned: one row per
    comparison with ``family`` (kept on every row, so an adjusted p always says which family
    it belongs to), ``comparison``, ``p`` and ``p_holm``. NaN p-values stay NaN and do not
    count towards the family's size.
    """
    names = list(pvalues)
    raw = np.array([pvalues[name] for name in names], dtype=float)
    return pd.DataFrame({"family": family, "comparison": names, "p": raw,
                         "p_holm": holm_adjust(raw)})


@dataclass(frozen=True)
class NonInferiority:
    """A one-sided test of H0: A - B <= -margin against H1: A - B > -margin."""

    estimate: float
    lower_bound: float  # one-sided (1 - alpha) lower confidence bound of A - B
    pvalue: float
    margin: float
    non_inferior: bool


def non_inferiority(differences: Sequence[float] | np.ndarray, margin: float, *,
                    alpha: float = 0.05) -> NonInferiority:
    """Tests that A is not worse than B by `margin` or more, from per-seed differences A - B:
    a one-sided one-sample t-test against -margin (``scipy.stats.ttest_1samp``, alternative
    "greater") and the matching one-sided lower confidence bound. A "≥" claim holds when
    p < alpha (the lower bound is above -margin). Fewer than two differences, or differences
    that do not vary, give NaN and no claim."""
    if margin < 0:
        raise ValueError(f"the non-inferiority margin is a distance, got {margin}")
    d = np.asarray(differences, dtype=float)
    estimate = float(d.mean()) if d.size else math.nan
    if d.size < 2 or d.std(ddof=1) == 0:
        return NonInferiority(estimate, math.nan, math.nan, margin, False)
    test = stats.ttest_1samp(d, -margin, alternative="greater")
    low = float(test.confidence_interval(confidence_level=1.0 - alpha).low)
    return NonInferiority(estimate, low, float(test.pvalue), margin, bool(test.pvalue < alpha))


def bootstrap_non_inferiority(result: TwoLevelResult, margin: float, *,
                              alpha: float = 0.05) -> NonInferiority:
    """The same test from a two-level bootstrap: p = (number of resampled differences at or
    below -margin, + 1) / (resamples + 1); the lower bound is their alpha quantile."""
    if margin < 0:
        raise ValueError(f"the non-inferiority margin is a distance, got {margin}")
    d = result.differences
    p = float((np.count_nonzero(d <= -margin) + 1) / (d.size + 1))
    low = float(np.percentile(d, 100.0 * alpha))
    return NonInferiority(result.estimate, low, p, margin, p < alpha)


class HasInterval(Protocol):
    estimate: float
    low: float
    high: float


def verdict(per_task: Mapping[str, HasInterval], name_a: str = "A", name_b: str = "B") -> str:
    """On which tasks A wins (interval above 0), loses (below 0) or ties (interval contains
    0), e.g. ``"A - B: wins on stsb (+26.2 [+17.0, +35.5]); loses on rte (-2.4 [-3.1, -1.7]);
    ties on cola, mrpc"``. A task without an interval (too few seeds, zero variance) is listed
    as ``no interval``. Works with `SeedDifference` and `TwoLevelResult` alike."""
    groups: dict[str, list[str]] = {"wins": [], "loses": [], "ties": [], "no interval": []}
    for task, result in per_task.items():
        if not (math.isfinite(result.low) and math.isfinite(result.high)):
            groups["no interval"].append(task)
        elif result.low > 0 or result.high < 0:
            detail = f"{task} ({result.estimate:+.1f} [{result.low:+.1f}, {result.high:+.1f}])"
            groups["wins" if result.low > 0 else "loses"].append(detail)
        else:
            groups["ties"].append(task)
    parts = [f"{label} on {', '.join(tasks)}" if label != "no interval"
             else f"no interval on {', '.join(tasks)}"
             for label, tasks in groups.items() if tasks]
    return f"{name_a} - {name_b}: " + ("; ".join(parts) if parts else "no tasks")

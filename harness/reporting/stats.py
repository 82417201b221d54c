"""The report's statistics: confidence intervals over seeds and paired tests between methods.

- `bootstrap_ci(values)`: percentile-bootstrap confidence interval of a mean over seeds;
  `t_ci(values)`: the Student-t interval of the same mean, for comparison.
- `paired_comparison(a, b)`: two methods' runs (columns ``task``, ``seed``, ``score``) paired on
  the (task, seed) pairs both have; the mean difference a - b, its Student-t CI, a sign-flip
  permutation test (exact up to 16 pairs, Monte Carlo beyond), the Wilcoxon signed-rank test,
  wins/losses/ties and the per-task mean differences, in a `PairedResult`.
- `holm_adjust(p_values)`: Holm's step-down adjustment of a family of p-values. The report's
  task-by-task verdicts and their families are in :mod:`harness.reporting.verdicts`.

Seeds are few (typically 2-5 per task), so every interval here is rough: with n values the
bootstrap cannot see variation it has not sampled, and its percentile interval is too narrow
for small n (with 2 values it is simply the range of the two). The paired tests pool tasks and
seeds, which gives them more units than any single task has; the sign-flip test is the one that
decides `significant`, because it is exact for small n and needs no distributional assumption
beyond the two methods being exchangeable within each (task, seed) pair under the null.
Where several comparisons are claimed at once, their p-values are Holm-adjusted over that
family before any is called significant: five tests at 0.05 each would call one difference
in four real by chance. The report's intervals are Student-t intervals (of a cell's mean
over seeds, of a mean paired difference): a percentile bootstrap over 3 seeds is their range,
far narrower than 95%.

Scores are in the suite's points (metric x 100). Tasks have different spreads (CoLA's MCC moves
far more between seeds than SST-2's accuracy), so a raw mean difference is dominated by the
noisy tasks; ``normalize="task_z"`` divides each task's differences by that task's score
standard deviation first (see `paired_comparison`). The per-task mean differences are always
reported in raw points.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

EXACT_PERMUTATION_MAX_PAIRS = 16  # 2**16 sign patterns enumerated; Monte Carlo beyond
_CHUNK_ELEMENTS = 2_000_000  # resamples x n held in memory at once

Normalize = Literal["none", "task_z"]


def _finite(values: Sequence[float] | np.ndarray | pd.Series) -> np.ndarray:
    array = np.asarray(values, dtype=float).ravel()
    return array[np.isfinite(array)]


def _bootstrap_means(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of `resamples` resamples of `values` with replacement."""
    n = values.size
    block = max(1, _CHUNK_ELEMENTS // n)
    means = np.empty(resamples)
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        index = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = values[index].mean(axis=1)
    return means


def bootstrap_ci(values: Sequence[float] | np.ndarray | pd.Series, *, confidence: float = 0.95,
                 resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of `values` (one score per seed).

    The seeds are resampled with replacement `resamples` times and the interval is the
    (1 - confidence)/2 and (1 + confidence)/2 quantiles of the resampled means. The result is
    deterministic for a given `seed`. NaN values (failed runs) are ignored; no values at all
    gives (nan, nan), and a single value v gives (v, v).

    Read it with care for few seeds: the bootstrap only knows the spread it has seen, so for
    small n the percentile interval is too narrow (its coverage is well below the nominal
    level). With 2 values it is just the interval between them; with 3 it is nearly the range
    of the three (each extreme alone has probability 1/27 > 2.5%). `t_ci` gives the wider
    Student-t interval of the same mean for comparison.
    """
    data = _finite(values)
    if data.size == 0:
        return (math.nan, math.nan)
    if data.size == 1 or np.all(data == data[0]):
        return (float(data[0]), float(data[0]))
    _check_confidence(confidence)
    means = _bootstrap_means(data, resamples, np.random.default_rng(seed))
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return (float(low), float(high))


def t_ci(values: Sequence[float] | np.ndarray | pd.Series, *,
         confidence: float = 0.95) -> tuple[float, float]:
    """Student-t confidence interval of the mean: mean +- t(n-1) * s / sqrt(n), s with ddof 1.

    Assumes roughly normal scores across seeds; for 2-3 seeds it is much wider than the
    bootstrap interval (t with 1 degree of freedom is 12.7 at 95%), which is the honest width
    for so few seeds. NaN values are ignored; fewer than two values give (nan, nan).
    """
    from scipy import stats

    data = _finite(values)
    if data.size < 2:
        return (math.nan, math.nan)
    _check_confidence(confidence)
    mean = float(data.mean())
    half = float(stats.t.ppf((1.0 + confidence) / 2.0, data.size - 1)
                 * data.std(ddof=1) / math.sqrt(data.size))
    return (mean - half, mean + half)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")


def sign_flip_pvalue(differences: Sequence[float] | np.ndarray, *, resamples: int = 10_000,
                     seed: int = 0,
                     exact_max: int = EXACT_PERMUTATION_MAX_PAIRS) -> tuple[float, bool]:
    """Two-sided paired permutation (sign-flip) test of mean difference 0.

    Under the null each pair's difference is as likely to be +d as -d; the p-value is the
    share of sign patterns whose |sum| is at least the observed |sum|. All 2**n patterns are
    enumerated when n <= `exact_max` (so n pairs all of one sign give exactly 2 / 2**n when
    the |d| are distinct); beyond that `resamples` random patterns are drawn and
    p = (1 + hits) / (1 + resamples). Returns (p, exact). No differences, or all zero, give 1.
    """
    data = _finite(differences)
    n = data.size
    if n == 0 or not np.any(data):
        return (1.0, True)
    observed = abs(float(data.sum()))
    tolerance = 1e-9 * float(np.abs(data).sum())
    if n <= exact_max:
        patterns = np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)
        signs = 1.0 - 2.0 * (patterns & 1)
        sums = np.abs(signs @ data)
        return (float(np.mean(sums >= observed - tolerance)), True)
    rng = np.random.default_rng(seed)
    hits = 0
    block = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, block):
        size = min(block, resamples - start)
        signs = rng.choice(np.array([-1.0, 1.0]), size=(size, n))
        hits += int(np.sum(np.abs(signs @ data) >= observed - tolerance))
    return ((1 + hits) / (1 + resamples), False)


def wilcoxon_pvalue(differences: Sequence[float] | np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value (scipy; zero differences dropped, Wilcox's rule).

    All-zero (or no) differences give 1.0 rather than scipy's error or NaN.
    """
    from scipy import stats

    data = _finite(differences)
    if not np.any(data):
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ties / small-sample notes from scipy
        result = stats.wilcoxon(data, zero_method="wilcox", alternative="two-sided")
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else min(1.0, p)


@dataclass(frozen=True)
class PairedResult:
    """Method a against method b over their common (task, seed) pairs; differences are a - b."""

    name_a: str
    name_b: str
    n_pairs: int
    tasks: tuple[str, ...]
    mean_diff: float  # mean of a - b over the pairs, in `unit`
    ci_low: float  # Student-t CI of mean_diff over the pairs
    ci_high: float
    p_permutation: float  # two-sided sign-flip permutation test
    p_wilcoxon: float  # two-sided Wilcoxon signed-rank test
    significant: bool  # p_holm (else p_permutation) < alpha
    wins: int  # pairs where a scored higher
    losses: int
    ties: int
    per_task: dict[str, float] = field(default_factory=dict)  # mean a - b per task, raw points
    per_task_pairs: dict[str, int] = field(default_factory=dict)
    permutation_exact: bool = True
    normalize: str = "none"
    confidence: float = 0.95
    alpha: float = 0.05
    p_holm: float | None = None  # p_permutation Holm-adjusted over `family` comparisons
    family: int = 1

    @property
    def n_tasks(self) -> int:
        return len(self.tasks)

    @property
    def unit(self) -> str:
        return "points" if self.normalize == "none" else "task SDs"

    def summary(self) -> str:
        """One sentence, e.g. 'kd vs finetune: +0.43 points (95% CI -0.10 to +0.95) over 10
        pairs on 5 tasks; sign-flip p = 0.21, Wilcoxon p = 0.19: not significant'."""
        head = f"{self.name_a} vs {self.name_b}"
        if self.n_pairs == 0:
            return f"{head}: no common (task, seed) pairs"
        level = f"{self.confidence * 100:g}%"
        verdict = (f"significant at {self.alpha:g}" if self.significant
                   else "not significant")
        pairs = "pair" if self.n_pairs == 1 else "pairs"
        tasks = "task" if self.n_tasks == 1 else "tasks"
        adjusted = ("" if self.p_holm is None else
                    f", Holm-adjusted over {self.family} comparisons p {format_p(self.p_holm)}")
        return (f"{head}: {self.mean_diff:+.2f} {self.unit} ({level} CI {self.ci_low:+.2f} to "
                f"{self.ci_high:+.2f}) over {self.n_pairs} {pairs} on {self.n_tasks} {tasks}; "
                f"sign-flip p {format_p(self.p_permutation)}{adjusted}, "
                f"Wilcoxon p {format_p(self.p_wilcoxon)}: {verdict}")

    def row(self) -> dict[str, object]:
        """Flat fields for a table row (per-task differences as one string)."""
        return {
            "method_a": self.name_a, "method_b": self.name_b, "n_pairs": self.n_pairs,
            "n_tasks": self.n_tasks, "tasks": ", ".join(self.tasks),
            "mean_diff": self.mean_diff, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "p_permutation": self.p_permutation, "p_holm": self.p_holm,
            "p_wilcoxon": self.p_wilcoxon,
            "significant": self.significant, "wins": self.wins, "losses": self.losses,
            "ties": self.ties,
            "per_task": ", ".join(f"{task} {diff:+.2f}" for task, diff in self.per_task.items()),
            "permutation_exact": self.permutation_exact, "normalize": self.normalize,
            "summary": self.summary(),
        }


def format_p(p: float) -> str:
    """'= 0.21', '= 0.008', '< 0.001' (with the relation, for 'p {format_p(p)}')."""
    if math.isnan(p):
        return "= n/a"
    if p < 0.001:
        return "< 0.001"
    if p < 0.1:
        return f"= {p:.3f}"
    return f"= {p:.2f}"


def _runs(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    missing = {"task", "seed", "score"} - set(frame.columns)
    if missing:
        raise ValueError(f"{name}: missing columns {sorted(missing)} (need task, seed, score)")
    runs = frame[["task", "seed", "score"]].copy()
    runs["task"] = runs["task"].astype(str)
    runs["score"] = pd.to_numeric(runs["score"], errors="coerce")
    runs = runs[np.isfinite(runs["score"].to_numpy(dtype=float))]
    duplicated = runs.duplicated(["task", "seed"], keep=False)
    if duplicated.any():
        keys = sorted({(t, s) for t, s in zip(runs.loc[duplicated, "task"],
                                               runs.loc[duplicated, "seed"], strict=True)})
        raise ValueError(f"{name}: more than one score for (task, seed) {keys[:5]}")
    return runs


def paired_comparison(a: pd.DataFrame, b: pd.DataFrame, *, name_a: str | None = None,
                      name_b: str | None = None, normalize: Normalize = "none",
                      confidence: float = 0.95, alpha: float = 0.05, resamples: int = 10_000,
                      seed: int = 0) -> PairedResult:
    """Compare method a with method b over the (task, seed) pairs both have run.

    `a` and `b` hold one method's runs each, with columns ``task``, ``seed``, ``score`` (more
    columns are ignored; a ``method`` column, when present with one value, names the method).
    Rows with a NaN score are dropped; a (task, seed) appearing twice in one frame is an error.
    Pairs present in only one frame are left out. Differences are a - b.

    - mean_diff and its Student-t CI over the pairs (tasks and seeds alike), so the spread
      between tasks counts as uncertainty too;
    - p_permutation: two-sided sign-flip test (`sign_flip_pvalue`), which decides
      ``significant`` (p < alpha);
    - p_wilcoxon: two-sided Wilcoxon signed-rank test on the same differences;
    - wins / losses / ties: pairs where a is above / below / equal to b.

    ``normalize="task_z"`` divides each task's differences by the standard deviation (ddof 1)
    of that task's paired scores of both methods before the mean, CI and tests, so a noisy
    task does not outweigh the others; mean_diff and its CI are then in task SDs. The scale
    includes the gap between the methods, so it measures spread, not a standardized effect
    size. Wins/losses/ties and per_task stay in raw points.
    """
    if normalize not in ("none", "task_z"):
        raise ValueError(f"normalize must be 'none' or 'task_z', got {normalize!r}")
    _check_confidence(confidence)
    name_a = name_a if name_a is not None else _method_name(a, "a")
    name_b = name_b if name_b is not None else _method_name(b, "b")
    pairs = _runs(a, "a").merge(_runs(b, "b"), on=["task", "seed"], suffixes=("_a", "_b"))
    pairs = pairs.sort_values(["task", "seed"], kind="stable").reset_index(drop=True)
    common = dict(name_a=name_a, name_b=name_b, normalize=normalize, confidence=confidence,
                  alpha=alpha)
    if pairs.empty:
        return _no_pairs(**common)

    raw = (pairs["score_a"] - pairs["score_b"]).to_numpy(dtype=float)
    differences = raw
    if normalize == "task_z":
        scale = pd.concat([pairs[["task", "score_a"]].rename(columns={"score_a": "s"}),
                           pairs[["task", "score_b"]].rename(columns={"score_b": "s"})]
                          ).groupby("task")["s"].std(ddof=1)
        per_pair = pairs["task"].map(scale).to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            differences = np.where(per_pair > 0, raw / per_pair, 0.0)

    low, high = t_ci(differences, confidence=confidence)
    p_permutation, exact = sign_flip_pvalue(differences, resamples=resamples, seed=seed)
    by_task = pairs.assign(diff=raw).groupby("task", sort=True)["diff"]
    return PairedResult(
        n_pairs=len(pairs), tasks=tuple(sorted(pairs["task"].unique())),
        mean_diff=float(differences.mean()), ci_low=low, ci_high=high,
        p_permutation=p_permutation, p_wilcoxon=wilcoxon_pvalue(differences),
        significant=bool(p_permutation < alpha),
        wins=int(np.sum(raw > 0)), losses=int(np.sum(raw < 0)), ties=int(np.sum(raw == 0)),
        per_task={task: float(value) for task, value in by_task.mean().items()},
        per_task_pairs={task: int(value) for task, value in by_task.size().items()},
        permutation_exact=exact, **common)


def _no_pairs(name_a: str, name_b: str, **common: object) -> PairedResult:
    return PairedResult(name_a=name_a, name_b=name_b, n_pairs=0, tasks=(), mean_diff=math.nan,
                        ci_low=math.nan, ci_high=math.nan, p_permutation=math.nan,
                        p_wilcoxon=math.nan, significant=False, wins=0, losses=0, ties=0,
                        **common)  # type: ignore[arg-type]


def _method_name(frame: pd.DataFrame, default: str) -> str:
    if "method" in frame.columns:
        names = frame["method"].dropna().unique()
        if len(names) == 1:
            return str(names[0])
    return default


def holm_adjust(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error control); NaNs stay NaN."""
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full_like(p, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    m = finite.size
    running = 0.0
    for rank, index in enumerate(finite[np.argsort(p[finite], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted


"""harness.reporting.stats on small numbers made here: bootstrap and t intervals, the sign-flip and
Wilcoxon paired tests (checked against exact enumeration), pairing and the pairwise table."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from harness.reporting.stats import (
    bootstrap_ci,
    holm_adjust,
    paired_comparison,
    sign_flip_pvalue,
    t_ci,
    wilcoxon_pvalue,
)


def _frame(scores: dict[tuple[str, int], float], method: str | None = None) -> pd.DataFrame:
    frame = pd.DataFrame([(task, seed, score) for (task, seed), score in scores.items()],
                         columns=["task", "seed", "score"])
    if method is not None:
        frame.insert(0, "method", method)
    return frame


# ------------------------------------------------------------------------- intervals


def test_bootstrap_ci_contains_the_mean_and_is_deterministic():
    values = [71.2, 69.8, 72.5, 70.1, 73.0, 70.6, 71.9, 72.2]
    low, high = bootstrap_ci(values, seed=3)
    assert low < np.mean(values) < high
    assert min(values) <= low and high <= max(values)
    assert bootstrap_ci(values, seed=3) == (low, high)
    assert bootstrap_ci(np.array(values), seed=3) == (low, high)
    assert bootstrap_ci(values, seed=4) != (low, high)


def test_bootstrap_ci_narrows_with_more_values():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    low5, high5 = bootstrap_ci(values)
    low50, high50 = bootstrap_ci(values * 10)  # same spread, ten times the seeds
    assert high50 - low50 < 0.5 * (high5 - low5)
    assert low50 < 3.0 < high50


def test_bootstrap_ci_edge_cases():
    assert bootstrap_ci([64.5]) == (64.5, 64.5)
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    assert bootstrap_ci([1.0, float("nan"), 3.0]) == bootstrap_ci([1.0, 3.0])
    assert bootstrap_ci([3.0, 5.0]) == (3.0, 5.0)  # two seeds: just their range
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=95)


def _exact_bootstrap_quantiles(values: list[float], confidence: float = 0.95) -> np.ndarray:
    """Quantiles of the exact bootstrap distribution of the mean: all n**n equally likely
    resamples of n values, enumerated (the distribution Monte-Carlo resampling estimates)."""
    means = np.array([np.mean(sample)
                      for sample in itertools.product(values, repeat=len(values))])
    tail = (1 - confidence) / 2
    return np.quantile(means, [tail, 1 - tail], method="inverted_cdf")


def test_bootstrap_ci_matches_the_enumerated_bootstrap_for_three_values():
    values = [1.0, 2.0, 4.0]
    exact = _exact_bootstrap_quantiles(values)  # 27 resamples; each extreme has p = 1/27
    assert exact.tolist() == [1.0, 4.0]
    assert bootstrap_ci(values) == pytest.approx(tuple(exact))


def test_bootstrap_ci_matches_the_enumerated_bootstrap_for_five_values():
    values = [1.0, 2.0, 4.0, 8.0, 16.0]
    exact = _exact_bootstrap_quantiles(values)  # 3125 resamples
    spread = max(values) - min(values)
    for seed in range(3):
        low, high = bootstrap_ci(values, seed=seed)
        assert abs(low - exact[0]) <= 0.02 * spread
        assert abs(high - exact[1]) <= 0.02 * spread


def test_t_ci_is_the_student_interval_and_wider_for_few_seeds():
    values = [70.0, 71.0, 73.0]
    expected = scipy_stats.t.interval(0.95, df=2, loc=np.mean(values),
                                      scale=scipy_stats.sem(values))
    assert t_ci(values) == pytest.approx(expected)
    low, high = t_ci(values)
    boot_low, boot_high = bootstrap_ci(values)
    assert low < boot_low and high > boot_high
    assert all(math.isnan(v) for v in t_ci([70.0]))


# ------------------------------------------------------------------------- paired tests


def test_sign_flip_identical_methods_give_p_one():
    assert sign_flip_pvalue(np.zeros(6)) == (1.0, True)
    assert sign_flip_pvalue([]) == (1.0, True)


@pytest.mark.parametrize("n", [3, 5, 8, 12])
def test_sign_flip_consistently_better_gives_the_exact_minimum(n):
    differences = 0.5 + np.arange(n) * 0.1  # all positive, distinct
    p, exact = sign_flip_pvalue(differences)
    assert exact
    assert p == pytest.approx(2 / 2**n)
    assert sign_flip_pvalue(-differences)[0] == pytest.approx(2 / 2**n)


def test_sign_flip_matches_brute_force_enumeration_for_eight_pairs():
    differences = np.array([1.3, -0.4, 2.1, 0.7, -1.1, 0.9, 0.2, 1.6])
    observed = abs(differences.sum())
    hits = sum(abs(np.dot(signs, differences)) >= observed - 1e-12
               for signs in itertools.product([-1.0, 1.0], repeat=8))
    p, exact = sign_flip_pvalue(differences)
    assert exact
    assert p == hits / 256
    assert 0.05 < p < 0.5


def test_sign_flip_monte_carlo_agrees_with_exact():
    rng = np.random.default_rng(7)
    differences = rng.normal(0.4, 1.0, size=12)
    exact_p, _ = sign_flip_pvalue(differences)
    mc_p, exact = sign_flip_pvalue(differences, exact_max=0, resamples=20_000, seed=1)
    assert not exact
    assert abs(mc_p - exact_p) < 0.02
    assert sign_flip_pvalue(differences, exact_max=0, seed=1) == \
        sign_flip_pvalue(differences, exact_max=0, seed=1)
    many, exact = sign_flip_pvalue(np.linspace(0.1, 2.0, 30))  # 30 pairs: Monte Carlo
    assert not exact and many == pytest.approx(1 / 10_001)


def test_wilcoxon_zero_and_exact_cases():
    assert wilcoxon_pvalue(np.zeros(5)) == 1.0
    assert wilcoxon_pvalue([]) == 1.0
    # six positive distinct differences: the exact two-sided signed-rank p is 2 / 2**6
    assert wilcoxon_pvalue([0.3, 0.5, 0.8, 1.1, 1.7, 2.0]) == pytest.approx(2 / 64)


# ------------------------------------------------------------------------- paired_comparison


def test_paired_comparison_uses_only_common_pairs():
    a = _frame({("RTE", 0): 66.0, ("RTE", 1): 68.0, ("RTE", 2): 65.0, ("CoLA", 0): 40.0},
               method="kd")
    b = _frame({("RTE", 1): 67.0, ("RTE", 2): 62.0, ("RTE", 3): 60.0, ("MRPC", 0): 85.0},
               method="finetune")
    result = paired_comparison(a, b)
    assert result.name_a == "kd" and result.name_b == "finetune"
    assert result.n_pairs == 2 and result.tasks == ("RTE",) and result.n_tasks == 1
    assert result.mean_diff == pytest.approx(2.0)  # (68-67 + 65-62) / 2
    assert result.per_task == {"RTE": pytest.approx(2.0)}
    assert result.per_task_pairs == {"RTE": 2}
    assert (result.wins, result.losses, result.ties) == (2, 0, 0)
    assert result.p_permutation == 0.5  # 2 pairs: the smallest possible two-sided p
    assert not result.significant


def test_paired_comparison_consistently_better_is_significant():
    tasks = ["RTE", "MRPC", "STS-B", "CoLA"]
    a, b = {}, {}
    for t, task in enumerate(tasks):
        for seed in range(2):
            base = 60.0 + 5 * t + seed
            b[(task, seed)] = base
            a[(task, seed)] = base + 0.5 + 0.1 * (2 * t + seed)
    result = paired_comparison(_frame(a), _frame(b), name_a="pkd", name_b="finetune")
    assert result.n_pairs == 8 and result.n_tasks == 4
    assert result.p_permutation == pytest.approx(2 / 2**8)
    assert result.p_wilcoxon == pytest.approx(2 / 2**8)
    assert result.significant
    assert 0 < result.ci_low <= result.mean_diff <= result.ci_high
    assert (result.wins, result.losses, result.ties) == (8, 0, 0)
    summary = result.summary()
    assert summary.startswith("pkd vs finetune: +0.85 points (95% CI ")
    assert "over 8 pairs on 4 tasks; sign-flip p = 0.008, Wilcoxon p = 0.008" in summary
    assert summary.endswith(": significant at 0.05")


def test_paired_comparison_identical_methods():
    runs = _frame({("RTE", 0): 66.0, ("RTE", 1): 68.0, ("SST-2", 0): 90.0})
    result = paired_comparison(runs, runs.copy())
    assert result.mean_diff == 0.0 and (result.ci_low, result.ci_high) == (0.0, 0.0)
    assert result.p_permutation == 1.0 and result.p_wilcoxon == 1.0
    assert (result.wins, result.losses, result.ties) == (0, 0, 3)
    assert not result.significant
    assert result.summary().endswith("sign-flip p = 1.00, Wilcoxon p = 1.00: not significant")


def test_paired_comparison_without_common_pairs():
    result = paired_comparison(_frame({("RTE", 0): 1.0}), _frame({("RTE", 1): 2.0}),
                               name_a="x", name_b="y")
    assert result.n_pairs == 0 and math.isnan(result.mean_diff) and not result.significant
    assert result.summary() == "x vs y: no common (task, seed) pairs"


def test_paired_comparison_input_checks():
    good = _frame({("RTE", 0): 1.0, ("RTE", 1): 2.0})
    duplicated = pd.concat([good, good])
    with pytest.raises(ValueError, match="more than one score"):
        paired_comparison(duplicated, good)
    with pytest.raises(ValueError, match="missing columns"):
        paired_comparison(good.drop(columns="seed"), good)
    with pytest.raises(ValueError, match="normalize"):
        paired_comparison(good, good, normalize="z")  # type: ignore[arg-type]
    failed = _frame({("RTE", 0): float("nan"), ("RTE", 1): 3.0})
    assert paired_comparison(failed, good).n_pairs == 1  # a failed run is left out


def test_task_z_is_invariant_to_a_tasks_scale():
    rng = np.random.default_rng(0)
    a, b = {}, {}
    for task in ("CoLA", "SST-2", "RTE"):
        for seed in range(3):
            b[(task, seed)] = 50 + rng.normal(0, 1)
            a[(task, seed)] = b[(task, seed)] + 0.3 + rng.normal(0, 1)
    base = paired_comparison(_frame(a), _frame(b), normalize="task_z")
    scaled_a = {k: v * 10 if k[0] == "CoLA" else v for k, v in a.items()}
    scaled_b = {k: v * 10 if k[0] == "CoLA" else v for k, v in b.items()}
    scaled = paired_comparison(_frame(scaled_a), _frame(scaled_b), normalize="task_z")
    assert scaled.mean_diff == pytest.approx(base.mean_diff)
    assert scaled.p_permutation == pytest.approx(base.p_permutation)
    assert scaled.per_task["CoLA"] == pytest.approx(10 * base.per_task["CoLA"])  # raw points
    assert base.unit == "task SDs" and "task SDs" in base.summary()
    raw = paired_comparison(_frame(scaled_a), _frame(scaled_b))
    assert raw.unit == "points" and raw.mean_diff != pytest.approx(base.mean_diff)


def test_holm_adjust_known_values():
    adjusted = holm_adjust([0.01, 0.04, 0.03, float("nan")])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(adjusted[3])


def test_paired_interval_is_the_student_t_interval_of_the_differences():
    """A percentile bootstrap over few pairs is narrower than its level says, and could
    exclude 0 next to a test that is far from significant; the interval is Student-t's."""
    a = pd.DataFrame({"task": ["rte"] * 4, "seed": [1, 2, 3, 4], "score": [60.0, 58, 61, 57]})
    b = pd.DataFrame({"task": ["rte"] * 4, "seed": [1, 2, 3, 4], "score": [55.0, 58.5, 56, 57]})
    result = paired_comparison(a, b)
    differences = (a["score"] - b["score"]).to_numpy()
    assert (result.ci_low, result.ci_high) == pytest.approx(t_ci(differences))
    assert result.ci_low < 0 < result.ci_high

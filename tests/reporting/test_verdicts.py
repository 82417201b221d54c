"""The report's verdicts checked by hand: one comparison recomputed from two tiny rows'
predictions files (the two-level bootstrap's interval and p, the seeds' t interval), the
family's Holm adjustment and the outcomes it decides."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.config.schema import VerdictsConfig
from harness.data.tasks import get_task
from harness.experiments.predictions import write_predictions
from harness.reporting.comparisons import SeedDifference
from harness.reporting.verdicts import (
    Comparison,
    TaskVerdict,
    VerdictInputs,
    adjust_family,
    family_table,
    run_family,
)
from tests.records import run_record

EXAMPLES = 40
RESAMPLES = 400


def _store(tmp_path: Path, rng: np.random.Generator, labels: np.ndarray,
           accuracy: dict[str, list[float]]) -> tuple[pd.DataFrame, dict, np.ndarray]:
    """Records and predictions files of rows ``a`` and ``b`` on RTE, one per seed, each
    right on about the given share of the examples; the runs frame and the records."""
    task = get_task("rte")
    ids = np.arange(100, 100 + EXAMPLES)
    rows, records, predicted = [], {}, {}
    for label, shares in accuracy.items():
        for seed, share in enumerate(shares, start=1):
            right = rng.random(EXAMPLES) < share
            classes = np.where(right, labels, 1 - labels)
            logits = np.stack([1.0 - classes, classes.astype(float)], axis=1)
            order = rng.permutation(EXAMPLES)  # a file's rows need not be in label order
            path = tmp_path / "s" / label / "rte" / f"{label}-{seed}.predictions.npz"
            summary = write_predictions(path, task, {"dev": (ids[order], logits[order])})
            score = 100.0 * float(np.mean(classes == labels))
            record = run_record(method=label, task="rte", seed=seed, main_metric="accuracy",
                                main_score=score, predictions=summary.model_dump())
            records[record.run_id] = record
            predicted[(label, seed)] = classes
            rows.append({"label": label, "task": "rte", "seed": seed, "score": score,
                         "run_id": record.run_id})
    return pd.DataFrame(rows), records, ids, predicted


def test_one_comparison_by_hand_from_two_rows_predictions(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 2, EXAMPLES)
    runs, records, ids, predicted = _store(
        tmp_path, rng, labels, {"a": [0.8, 0.75, 0.85], "b": [0.6, 0.65, 0.55]})
    settings = VerdictsConfig(resamples=RESAMPLES, seed=3)
    inputs = VerdictInputs(runs, records, tmp_path, {"rte": (ids, labels)},
                           {"rte": 10.0}, settings)
    [comparison] = run_family(inputs, "test", [("a", "b", ">", "")], ["rte"])
    row = family_table([comparison]).iloc[0]

    # the two-level bootstrap by hand: per resample seeds then examples, with replacement
    a = np.stack([predicted[("a", seed)] for seed in (1, 2, 3)])
    b = np.stack([predicted[("b", seed)] for seed in (1, 2, 3)])
    draw = np.random.default_rng(3)
    differences = []
    for _ in range(RESAMPLES):
        seeds = draw.integers(0, 3, 3)
        examples = draw.integers(0, EXAMPLES, EXAMPLES)
        gold = labels[examples]
        differences.append(np.mean([100 * np.mean(a[s, examples] == gold)
                                    - 100 * np.mean(b[s, examples] == gold) for s in seeds]))
    differences = np.array(differences)
    low, high = np.percentile(differences, [2.5, 97.5])
    p = min(1.0, 2 * min((np.sum(differences <= 0) + 1) / (RESAMPLES + 1),
                         (np.sum(differences >= 0) + 1) / (RESAMPLES + 1)))
    assert row["two_level_low"] == pytest.approx(low)
    assert row["two_level_high"] == pytest.approx(high)
    assert row["p"] == pytest.approx(p) and row["p_source"] == "two-level"

    # the seeds' t interval by hand
    paired = (runs[runs["label"] == "a"]["score"].to_numpy()
              - runs[runs["label"] == "b"]["score"].to_numpy())
    half = stats.t.ppf(0.975, 2) * paired.std(ddof=1) / math.sqrt(3)
    assert row["difference"] == pytest.approx(paired.mean())
    assert (row["t_low"], row["t_high"]) == pytest.approx((paired.mean() - half,
                                                           paired.mean() + half))
    # one test in the family: Holm leaves its p as it is
    assert row["p_holm"] == pytest.approx(p)
    assert row["outcome"] == ("wins" if p < 0.05 and row["t_low"] > 0 else "ties")
    across = family_table([comparison]).iloc[1]
    assert across["difference"] == pytest.approx(paired.mean() / 10.0)
    assert across["two_level_low"] == pytest.approx(low / 10.0)


@pytest.mark.slow
def test_the_family_adjusts_every_task_together_and_a_damaged_file_is_named(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    labels = rng.integers(0, 2, EXAMPLES)
    runs, records, ids, _ = _store(tmp_path, rng, labels, {
        "a": [0.9, 0.9, 0.9], "b": [0.55, 0.5, 0.6], "c": [0.9, 0.88, 0.92]})
    settings = VerdictsConfig(resamples=RESAMPLES)
    inputs = VerdictInputs(runs, records, tmp_path, {"rte": (ids, labels)},
                           {"rte": 10.0}, settings)
    pairs = [("a", "b", ">", ""), ("a", "c", ">=", "")]
    table = family_table(run_family(inputs, "orderings", pairs, ["rte"]))
    per_task = table[table["task"] == "rte"].set_index("comparison")
    raw = [per_task.loc["a > b", "p"], per_task.loc["a >= c", "p"],
           per_task.loc["a >= c", "p_non_inferiority"]]
    order = np.argsort(raw)
    expected = np.maximum.accumulate([min(1.0, (3 - rank) * raw[i])
                                      for rank, i in enumerate(order)])
    adjusted = [per_task.loc["a > b", "p_holm"], per_task.loc["a >= c", "p_holm"],
                per_task.loc["a >= c", "p_non_inferiority_holm"]]
    assert [adjusted[i] for i in order] == pytest.approx(list(expected))
    assert per_task.loc["a > b", "outcome"] == "wins"
    assert per_task.loc["a >= c", "outcome"] in ("non-inferior", "inconclusive")

    # a damaged file: named, and its task falls back to the seeds
    victim = next(record for record in records.values() if record.method == "b")
    path = tmp_path / "s" / "b" / "rte" / victim.predictions.file
    path.write_bytes(path.read_bytes()[:-10])
    inputs = VerdictInputs(runs, records, tmp_path, {"rte": (ids, labels)},
                           {"rte": 10.0}, settings)
    table = family_table(run_family(inputs, "orderings", pairs[:1], ["rte"]))
    assert table.iloc[0]["p_source"] == "t over seeds"
    # the smallest detectable difference from the seeds: t quantiles, 2 degrees of freedom
    paired = (runs[runs["label"] == "a"]["score"].to_numpy()
              - runs[runs["label"] == "b"]["score"].to_numpy())
    se = paired.std(ddof=1) / math.sqrt(3)
    assert table.iloc[0]["detectable"] == pytest.approx(
        (stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) * se)
    assert len(inputs.problems) == 1 and victim.predictions.file in inputs.problems[0]


def _verdict(estimate: float, low: float, high: float, p: float) -> TaskVerdict:
    seeds = SeedDifference(estimate=estimate, low=low, high=high, pvalue=p, sd=1.0, n=3,
                           zero_variance=False)
    return TaskVerdict(task="rte", seeds=(1, 2, 3), seed_level=seeds, two_level=None,
                       detectable=1.0, p=p)


@pytest.mark.parametrize(("estimate", "low", "high", "outcome"), [
    (2.0, 0.5, 3.5, "wins"),
    (-2.0, -3.5, -0.5, "loses"),
    (2.0, -0.6, 4.6, "ties"),          # the seeds' interval holds 0: no win on p alone
    (-2.0, -4.6, 0.6, "ties"),
    (2.0, math.nan, math.nan, "ties"),  # one seed: no interval, nothing decided
])
def test_a_win_needs_the_seeds_interval_on_its_side_as_well_as_the_adjusted_p(
        estimate: float, low: float, high: float, outcome: str) -> None:
    comparison = Comparison(family="f", a="a", b="b", relation=">",
                            tasks={"rte": _verdict(estimate, low, high, 0.001)})
    [adjusted] = adjust_family([comparison])
    assert adjusted.tasks["rte"].p_holm == pytest.approx(0.001)
    assert adjusted.tasks["rte"].outcome == outcome

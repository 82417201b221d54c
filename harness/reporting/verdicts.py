"""The report's verdicts: two rows compared task by task, over seeds and dev examples, with
one Holm family per claim set.

A *comparison* is two rows of the report (labels ``a`` and ``b``) on the (task, seed) runs
both have, seed s of one paired with seed s of the other. Per task it gives:

- the mean difference a - b over seeds with its Student-t interval (``seed_level``);
- where both rows' runs kept their dev predictions, the two-level bootstrap that resamples
  seeds and dev examples (``two_level``: interval, two-sided p, probability of improvement);
- the smallest difference the design could have detected (80% power at the suite's level),
  from the two-level standard error (normal quantiles), else from the seeds' (t quantiles
  with n - 1 degrees of freedom);
- the p the family adjusts: the two-level p where predictions exist, else the paired t-test's.

Across tasks a comparison states the difference of the shares of the teacher's margin over
the majority / mean baseline (0 = baseline, 1 = teacher): per task the score difference
divided by that task's teacher margin, averaged over the tasks, its interval from the
two-level resamples (tasks resampled independently).

A *family* is a set of claims read together (the paper orderings, the neighbours in the
ranking, the ablation table): its per-task p-values are Holm-adjusted together, and the
adjusted p decides each task's outcome: ``wins`` / ``loses`` (adjusted p below the level, by
the sign of the difference) or ``ties``. A ``>=`` claim is also tested as non-inferiority at
the suite's margin on every task (``verdicts.non_inferiority_margin``), from the same
resamples, its p adjusted within the family too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from harness.config.schema import VerdictsConfig
from harness.data.tasks import get_task
from harness.experiments.predictions import PredictionsError, load_predictions
from harness.experiments.record import RunRecord
from harness.reporting.comparisons import (
    NonInferiority,
    SeedDifference,
    TwoLevelResult,
    bootstrap_non_inferiority,
    minimum_detectable_difference,
    non_inferiority,
    per_task_difference,
    two_level_bootstrap,
)
from harness.reporting.stats import holm_adjust

POWER = 0.8
"""The power at which ``detectable`` is the smallest difference a test would detect."""

Labels = Mapping[str, tuple[np.ndarray, np.ndarray]]
"""task -> (example ids, gold labels) of the task's selection split."""


@dataclass(frozen=True)
class TaskVerdict:
    """One task of a comparison a - b."""

    task: str
    seeds: tuple[int, ...]
    seed_level: SeedDifference
    two_level: TwoLevelResult | None
    detectable: float
    """The smallest difference (points) a two-sided test at the suite's level would detect
    with 80% power, from the two-level standard error where there is one."""
    p: float
    p_holm: float = math.nan
    non_inferiority: NonInferiority | None = None
    p_non_inferiority_holm: float = math.nan
    outcome: str = "no test"

    @property
    def interval(self) -> tuple[float, float]:
        """The interval the report shows: two-level where predictions exist, else seeds'."""
        source = self.two_level if self.two_level is not None else self.seed_level
        return source.low, source.high

    @property
    def estimate(self) -> float:
        return self.seed_level.estimate


@dataclass(frozen=True)
class Comparison:
    """Rows ``a`` and ``b`` compared task by task (``relation``: the claim ``a > b``,
    ``a >= b``, or ``vs`` for no claim), with the difference of their shares of the
    teacher's margin across the tasks where every task has a two-level comparison."""

    family: str
    a: str
    b: str
    relation: str
    tasks: dict[str, TaskVerdict]
    source: str = ""
    across: tuple[float, float, float] | None = None
    """(estimate, low, high) of the mean over tasks of (a - b) / teacher margin."""

    @property
    def name(self) -> str:
        return f"{self.a} {self.relation} {self.b}"

    def summary(self) -> str:
        """The verdict in words: the tasks a wins, loses and ties on, then across tasks."""
        groups: dict[str, list[str]] = {}
        for task, verdict in self.tasks.items():
            low, high = verdict.interval
            text = (f"{task} ({verdict.estimate:+.2f} [{low:+.2f}, {high:+.2f}])"
                    if verdict.outcome in ("wins", "loses") else task)
            groups.setdefault(verdict.outcome, []).append(text)
        order = ("wins", "loses", "non-inferior", "inconclusive", "ties", "no test")
        parts = [f"{outcome} on {', '.join(groups[outcome])}" for outcome in order
                 if outcome in groups]
        text = f"{self.a} - {self.b}: " + ("; ".join(parts) if parts else "no common runs")
        if self.across is not None:
            estimate, low, high = self.across
            text += (f"; across {len(self.tasks)} tasks {estimate:+.3f} [{low:+.3f}, "
                     f"{high:+.3f}] of the teacher's margin")
        return text


@dataclass
class VerdictInputs:
    """What comparisons read: the runs (``label``, ``task``, ``seed``, ``score``,
    ``run_id``), the records, the store holding their predictions, the tasks' dev labels,
    each task's teacher margin (teacher - baseline, points) and the suite's settings."""

    runs: pd.DataFrame
    records: Mapping[str, RunRecord]
    root: Path
    labels: Labels
    margins: Mapping[str, float]
    settings: VerdictsConfig = field(default_factory=VerdictsConfig)
    problems: list[str] = field(default_factory=list)
    """Predictions that could not be read (named; their tasks fall back to seeds only)."""
    _predictions: dict[str, np.ndarray | None] = field(default_factory=dict)

    def predictions(self, run_id: str) -> np.ndarray | None:
        """The run's selection-split predictions in the order of the task's labels
        (logits or scores), or None (none kept, or a damaged file, named in problems)."""
        if run_id not in self._predictions:
            record = self.records.get(run_id)
            self._predictions[run_id] = self._read(record) if record is not None else None
        return self._predictions[run_id]

    def _read(self, record: RunRecord) -> np.ndarray | None:
        if record.predictions is None or record.task not in self.labels:
            return None
        try:
            split = load_predictions(record, self.root)[get_task(record.task).selection_split]
        except PredictionsError as error:
            self.problems.append(str(error))
            return None
        ids, _ = self.labels[record.task]
        order = {example: row for row, example in enumerate(split.ids.tolist())}
        if len(order) != len(ids) or any(example not in order for example in ids.tolist()):
            self.problems.append(f"run {record.run_id[:16]} ({record.method} {record.task} "
                                 f"seed {record.seed}): its predictions are not of the "
                                 "task's dev examples")
            return None
        return split.values[[order[example] for example in ids.tolist()]]


def _by_seed(runs: pd.DataFrame, label: str, task: str) -> pd.DataFrame:
    rows = runs[(runs["label"] == label) & (runs["task"] == task)]
    return rows.drop_duplicates("seed").set_index("seed")


def compare_task(inputs: VerdictInputs, a: str, b: str, task: str) -> TaskVerdict | None:
    """Rows ``a`` and ``b`` on ``task``, over the seeds both have (None: no common seed)."""
    runs_a, runs_b = _by_seed(inputs.runs, a, task), _by_seed(inputs.runs, b, task)
    seeds = sorted(set(runs_a.index) & set(runs_b.index))
    if not seeds:
        return None
    settings = inputs.settings
    seed_level = per_task_difference(runs_a.loc[seeds, "score"].to_numpy(float),
                                     runs_b.loc[seeds, "score"].to_numpy(float),
                                     confidence=settings.confidence)
    predicted = [[inputs.predictions(str(frame.loc[seed, "run_id"]))
                  if "run_id" in frame.columns else None for seed in seeds]
                 for frame in (runs_a, runs_b)]
    two_level = None
    if task in inputs.labels and all(p is not None for side in predicted for p in side):
        two_level = two_level_bootstrap(
            np.stack(predicted[0]), np.stack(predicted[1]), inputs.labels[task][1],
            get_task(task).main_metric, resamples=settings.resamples, seed=settings.seed,
            confidence=settings.confidence)
    alpha = 1.0 - settings.confidence
    if two_level is not None:
        p = two_level.pvalue
        detectable = minimum_detectable_difference(two_level.se, alpha=alpha)
    else:  # the paired t-test's: t quantiles with n - 1 degrees of freedom
        p = seed_level.pvalue
        se = seed_level.sd / math.sqrt(len(seeds)) if len(seeds) > 1 else math.nan
        degrees = len(seeds) - 1
        detectable = ((stats.t.ppf(1.0 - alpha / 2.0, degrees) + stats.t.ppf(POWER, degrees))
                      * se if math.isfinite(se) else math.nan)
    return TaskVerdict(task, tuple(int(seed) for seed in seeds), seed_level, two_level,
                       detectable, p)


def compare(inputs: VerdictInputs, family: str, a: str, b: str, tasks: Sequence[str], *,
            relation: str = "vs", source: str = "") -> Comparison:
    """``a`` against ``b`` on each of ``tasks`` they share, before the family's adjustment
    (:func:`adjust_family` decides the outcomes)."""
    verdicts = {task: verdict for task in tasks
                if (verdict := compare_task(inputs, a, b, task)) is not None}
    if relation == ">=":
        margin = inputs.settings.non_inferiority_margin
        alpha = 1.0 - inputs.settings.confidence
        for task, verdict in verdicts.items():
            test = (bootstrap_non_inferiority(verdict.two_level, margin, alpha=alpha)
                    if verdict.two_level is not None else non_inferiority(
                        _differences(inputs, a, b, task, verdict.seeds), margin, alpha=alpha))
            verdicts[task] = replace(verdict, non_inferiority=test)
    return Comparison(family, a, b, relation, verdicts, source,
                      _across(verdicts, inputs.margins, inputs.settings.confidence))


def _differences(inputs: VerdictInputs, a: str, b: str, task: str,
                 seeds: Sequence[int]) -> np.ndarray:
    runs_a, runs_b = _by_seed(inputs.runs, a, task), _by_seed(inputs.runs, b, task)
    return (runs_a.loc[list(seeds), "score"].to_numpy(float)
            - runs_b.loc[list(seeds), "score"].to_numpy(float))


def _across(verdicts: Mapping[str, TaskVerdict], margins: Mapping[str, float],
            confidence: float) -> tuple[float, float, float] | None:
    """The mean over tasks of the difference as a share of each task's teacher margin, with
    the percentile interval of the same mean over the tasks' two-level resamples."""
    if not verdicts or any(verdict.two_level is None or not margins.get(task, 0) > 0
                           for task, verdict in verdicts.items()):
        return None
    estimate = float(np.mean([verdict.estimate / margins[task]
                              for task, verdict in verdicts.items()]))
    resampled = np.mean([verdict.two_level.differences / margins[task]
                         for task, verdict in verdicts.items()], axis=0)
    low, high = np.percentile(resampled, [50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)])
    return estimate, float(low), float(high)


def adjust_family(comparisons: Sequence[Comparison], confidence: float = 0.95
                  ) -> list[Comparison]:
    """Holm over every per-task test of the family (and every non-inferiority test of its
    ``>=`` claims), then each task's outcome from its adjusted p."""
    tests = [(index, task, kind, p) for index, comparison in enumerate(comparisons)
             for task, verdict in comparison.tasks.items()
             for kind, p in (("difference", verdict.p),
                             ("non-inferiority", verdict.non_inferiority.pvalue
                              if verdict.non_inferiority is not None else math.nan))
             if math.isfinite(p)]
    adjusted = dict(zip([test[:3] for test in tests],
                        holm_adjust(np.array([test[3] for test in tests], dtype=float)),
                        strict=True))
    alpha = 1.0 - confidence
    result = []
    for index, comparison in enumerate(comparisons):
        tasks = {}
        for task, verdict in comparison.tasks.items():
            p_holm = adjusted.get((index, task, "difference"), math.nan)
            p_ni = adjusted.get((index, task, "non-inferiority"), math.nan)
            tasks[task] = replace(verdict, p_holm=p_holm, p_non_inferiority_holm=p_ni,
                                  outcome=_outcome(verdict, comparison.relation, p_holm, p_ni,
                                                   alpha))
        result.append(replace(comparison, tasks=tasks))
    return result


def _outcome(verdict: TaskVerdict, relation: str, p_holm: float, p_ni: float,
             alpha: float) -> str:
    if not math.isfinite(p_holm) and not math.isfinite(p_ni):
        return "no test"
    if p_holm < alpha and _seeds_agree(verdict):
        return "wins" if verdict.estimate > 0 else "loses"
    if relation == ">=":
        return "non-inferior" if p_ni < alpha else "inconclusive"
    return "ties"


def _seeds_agree(verdict: TaskVerdict) -> bool:
    """Whether the seeds' own t interval lies on the side of 0 the estimate is on. With a
    handful of seeds, resampling them in the two-level bootstrap understates how much a
    seed moves a score, so a win or a loss needs the seeds' interval to exclude 0 as well;
    fewer than two seeds have no interval and decide nothing."""
    seeds = verdict.seed_level
    if not (math.isfinite(seeds.low) and math.isfinite(seeds.high)):
        return False
    return seeds.low > 0 if verdict.estimate > 0 else seeds.high < 0


def run_family(inputs: VerdictInputs, family: str,
               pairs: Sequence[tuple[str, str, str, str]], tasks: Sequence[str]
               ) -> list[Comparison]:
    """One family of claims: each ``(a, b, relation, source)`` compared on ``tasks``, then
    Holm-adjusted together."""
    compared = [compare(inputs, family, a, b, tasks, relation=relation, source=source)
                for a, b, relation, source in pairs]
    return adjust_family(compared, inputs.settings.confidence)


def family_table(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """One row per (comparison, task) and one per comparison across its tasks, numbers
    unrounded: what the report's CSV holds."""
    rows = []
    for comparison in comparisons:
        common = {"family": comparison.family, "comparison": comparison.name,
                  "a": comparison.a, "b": comparison.b, "relation": comparison.relation}
        for task, verdict in comparison.tasks.items():
            two = verdict.two_level
            test = verdict.non_inferiority
            rows.append({**common, "task": task, "seeds": len(verdict.seeds),
                         "difference": verdict.estimate,
                         "t_low": verdict.seed_level.low, "t_high": verdict.seed_level.high,
                         "zero_variance": verdict.seed_level.zero_variance,
                         "two_level_low": two.low if two else math.nan,
                         "two_level_high": two.high if two else math.nan,
                         "p": verdict.p, "p_source": "two-level" if two else "t over seeds",
                         "p_holm": verdict.p_holm,
                         "probability_of_improvement":
                             two.probability_of_improvement if two else math.nan,
                         "detectable": verdict.detectable,
                         "p_non_inferiority": test.pvalue if test else math.nan,
                         "p_non_inferiority_holm": verdict.p_non_inferiority_holm,
                         "outcome": verdict.outcome})
        if comparison.across is not None:
            estimate, low, high = comparison.across
            rows.append({**common, "task": "across tasks (share of teacher margin)",
                         "seeds": None, "difference": estimate, "two_level_low": low,
                         "two_level_high": high, "outcome": ""})
    return pd.DataFrame(rows)


def display_table(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """The report's table of a family: a row per (comparison, task), numbers as text."""
    table = family_table(comparisons)
    if table.empty:
        return table

    def interval(low: float, high: float, digits: int) -> str:
        return "" if not (math.isfinite(low) and math.isfinite(high)) else \
            f"[{low:+.{digits}f}, {high:+.{digits}f}]"

    def p_text(value: float) -> str:
        return "" if not math.isfinite(value) else f"{value:.3f}" if value >= 0.001 else "<0.001"

    shown = []
    for _, row in table.iterrows():
        across = row["seeds"] is None or pd.isna(row["seeds"])
        digits = 3 if across else 2
        shown.append({
            "comparison": row["comparison"], "task": row["task"],
            "seeds": "" if across else int(row["seeds"]),
            "difference": f"{row['difference']:+.{digits}f}",
            "95% CI, seeds (t)": "" if across else (
                "all seeds equal" if row["zero_variance"]
                else interval(row["t_low"], row["t_high"], 2)),
            "95% CI, seeds x examples": interval(row["two_level_low"], row["two_level_high"],
                                                 digits),
            "p": "" if across else p_text(row["p"]),
            "p (Holm, family)": "" if across else p_text(row["p_holm"]),
            "P(a > b)": "" if across or pd.isna(row["probability_of_improvement"])
            else f"{row['probability_of_improvement']:.2f}",
            "detectable": "" if across or pd.isna(row["detectable"])
            else f"{row['detectable']:.2f}",
            **({"non-inferior p (Holm)": "" if across else p_text(row["p_non_inferiority_holm"])}
               if (table["relation"] == ">=").any() else {}),
            "outcome": row["outcome"]})
    return pd.DataFrame(shown)


def dev_labels(config, tasks: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each task's selection-split example ids and gold labels, read from the suite's data
    (the files its records' fingerprints name); a task whose data cannot be read is left
    out (its comparisons then rest on the seeds alone)."""
    from harness.data.loading import load_task

    labels = {}
    for task in tasks:
        spec = get_task(task)
        try:
            data = load_task(spec, source=config.data.source, data_dir=config.data.dir,
                             max_train_examples=config.data.max_train_examples.get(task),
                             subsample_seed=config.data.subsample_seed, test_splits=False)
        except (FileNotFoundError, ValueError):
            continue
        split = data.splits[spec.selection_split]
        labels[task] = (np.asarray(split["idx"], dtype=np.int64), np.asarray(split["label"]))
    return labels

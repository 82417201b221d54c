"""Comparison tables from the results store: method x task, mean (and spread) over seeds,
with the papers' values (harness.config.published) beside ours where a suite asks for them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.experiments.store import ResultsStore
from harness.reporting.frame import records_to_frame


def finished_records(results: Path, suite: str) -> pd.DataFrame:
    """One row per finished run of ``suite``: method (its row label, see
    :meth:`~harness.experiments.record.RunRecord.label`), task, seed, main score, seconds."""
    runs = records_to_frame(ResultsStore(results / suite).records())
    finished = runs[runs["status"] == "finished"]
    return finished[["label", "task", "seed", "main_score", "wall_seconds"]].set_axis(
        ["method", "task", "seed", "score", "seconds"], axis=1).reset_index(drop=True)


def score_table(records: pd.DataFrame, tasks: list[str], methods: list[str] | None = None
                ) -> pd.DataFrame:
    """Mean over seeds per method and task, an ``average`` over the tasks (only where every
    task has a score), and the seeds counted, in the order of ``methods``."""
    grouped = records.groupby(["method", "task"])["score"]
    means = grouped.mean().unstack("task").reindex(columns=tasks)
    table = means.copy()
    table["average"] = means.mean(axis=1, skipna=False)
    table["seeds"] = records.groupby("method")["seed"].nunique().astype(int)
    spread = grouped.std(ddof=0).unstack("task").reindex(columns=tasks)
    table["max_std"] = spread.max(axis=1)
    order = [m for m in (methods or list(table.index)) if m in table.index]
    return table.loc[order]


def with_anchors(table: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Ours beside the paper's: ``paper`` has one row per method and ``paper_<task>``
    columns (see :func:`harness.config.published.ablation_columns`)."""
    if paper.empty:
        return table
    return table.join(paper, how="left")


def markdown(table: pd.DataFrame) -> str:
    return table.to_markdown(floatfmt=".2f")

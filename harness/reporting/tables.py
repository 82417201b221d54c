"""Comparison tables from the results store: method x task, mean (and spread) over seeds,
with the papers' values (harness.config.published) beside ours where a suite asks for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.experiments.store import ResultsStore


def row_label(record: dict[str, Any]) -> str:
    """The table row of a record: its method, marked when the run departed from the
    method's recipe (tuned parameters, another student shape, a grid's budget), so such
    runs are never averaged with the recipe's own."""
    variation = record.get("variation") or {}
    marks = []
    if variation.get("overrides") or record.get("tuned"):
        marks.append("tuned")
    if variation.get("student"):
        marks.append(str(variation["student"]))
    if variation.get("task_epochs") is not None:
        marks.append("grid budget")
    return f"{record['method']} [{', '.join(marks)}]" if marks else record["method"]


def finished_records(results: Path, suite: str) -> pd.DataFrame:
    """One row per finished run of ``suite``: method (its row label, see
    :func:`row_label`), task, seed, main score, seconds."""
    rows = []
    for record in ResultsStore(results / suite).records():
        if record.get("status") != "finished":
            continue
        rows.append({"method": row_label(record), "task": record["task"],
                     "seed": record["seed"], "score": record["main_score"],
                     "seconds": record.get("wall_seconds")})
    return pd.DataFrame(rows, columns=["method", "task", "seed", "score", "seconds"])


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

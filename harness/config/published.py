"""The papers' published numbers ("anchors"), shown beside ours and never mixed into them.

One data file, ``suites/anchors/published.csv``, in long form: one published value per
line with where it comes from. Columns:

- ``source_label``: the row's name in the paper ("TinyBERT4", "BERT6-PKD-Skip").
- ``method`` / ``student``: the harness method and student shape it corresponds to
  (``teacher`` for the papers' teachers), so anchor rows sit beside ours.
- ``task``: a harness task name, ``mnli_m`` / ``mnli_mm`` for MNLI's two dev or test sets,
  ``average`` for the paper's own average, ``-`` for efficiency figures.
- ``split``: ``dev`` or ``test`` (``-`` for efficiency figures). Our runs are scored on dev
  (GLUE's test labels are hidden), so a test anchor is never compared with them silently.
- ``metric``: what the value measures (``accuracy``, ``f1``, ``mcc``, ``pearson``,
  ``spearman``, ``average``, ``unspecified`` where the source does not say; efficiency:
  ``parameters_millions``, ``flops_billions``, ``speedup``).
- ``value``; ``source``, ``table``, ``version``: the paper and where in it.
- ``verified``: ``true`` when checked against the source, ``false`` when transcribed from
  memory (reference.md's "(unverified)").
- ``group``: the ablation table a row belongs to (``procedure``, ``objective``,
  ``mapping``), empty for main tables; ``note``: caveats.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from harness.config.schema import SUITES_DIR

PUBLISHED = SUITES_DIR / "anchors" / "published.csv"
COLUMNS = ("source_label", "method", "student", "task", "split", "metric", "value", "source",
           "table", "version", "verified", "group", "note")
SPLITS = ("dev", "test")
EFFICIENCY_METRICS = ("parameters_millions", "flops_billions", "speedup")
SCORE_METRICS = ("accuracy", "f1", "mcc", "pearson", "spearman", "average", "unspecified")
TASK_ALIASES = {"mnli": "mnli_m"}
"""Suite task -> the anchor task its main score corresponds to (MNLI's main dev set is the
matched one)."""


class AnchorError(ValueError):
    """A malformed anchors file: the message names the file and line."""


def _row_error(path: Path, line: int, message: str) -> AnchorError:
    return AnchorError(f"{path}:{line}: {message}")


def _check_row(path: Path, line: int, row: dict[str, str]) -> dict[str, object]:
    for column in ("source_label", "method", "student", "task", "metric", "source", "table"):
        if not (row.get(column) or "").strip():
            raise _row_error(path, line, f"{column} is empty")
    try:
        value = float(row["value"])
    except (TypeError, ValueError):
        raise _row_error(path, line, f"value {row['value']!r} is not a number") from None
    verified = row["verified"].strip().lower()
    if verified not in ("true", "false"):
        raise _row_error(path, line, f"verified must be true or false, not {row['verified']!r}")
    metric = row["metric"].strip()
    if row["task"] == "-":
        if metric not in EFFICIENCY_METRICS:
            raise _row_error(path, line, f"an efficiency row (task '-') needs a metric in "
                             f"{list(EFFICIENCY_METRICS)}, not {metric!r}")
        if row["split"] != "-":
            raise _row_error(path, line, "an efficiency row (task '-') has split '-'")
    else:
        if metric not in SCORE_METRICS:
            raise _row_error(path, line, f"metric {metric!r} is not one of "
                             f"{list(SCORE_METRICS)}")
        if row["split"] not in SPLITS:
            raise _row_error(path, line, f"split must be dev or test, not {row['split']!r}")
    return {**{column: row[column].strip() for column in COLUMNS}, "value": value,
            "verified": verified == "true", "line": line}


def load_published(path: Path = PUBLISHED) -> pd.DataFrame:
    """Every published value, validated (an error names the file and line)."""
    if not path.exists():
        raise FileNotFoundError(f"anchors file {path} not found")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise AnchorError(f"{path}:1: the header must be {','.join(COLUMNS)}, "
                              f"not {','.join(reader.fieldnames or ())}")
        rows = []
        for row in reader:
            if None in row or any(value is None for value in row.values()):
                raise _row_error(path, reader.line_num,
                                 f"expected {len(COLUMNS)} fields (quote values with commas)")
            rows.append(_check_row(path, reader.line_num, row))
    frame = pd.DataFrame(rows, columns=[*COLUMNS, "line"])
    duplicated = frame.duplicated(["source_label", "student", "task", "split", "metric",
                                   "table"], keep=False)
    if duplicated.any():
        line = int(frame.loc[duplicated, "line"].iloc[1])
        raise _row_error(path, line, "the same value is listed twice")
    return frame


def anchor_task(task: str) -> str:
    return TASK_ALIASES.get(task, task)


def ablation_columns(published: pd.DataFrame, groups: list[str]) -> pd.DataFrame:
    """The dev values of the named ablation groups, one row per method and one column per
    task (``paper_<task>``), for joining beside a method x task table."""
    rows = published[published["group"].isin(groups) & (published["split"] == "dev")]
    if rows.empty:
        return pd.DataFrame()
    rows = rows.drop_duplicates(["method", "task"])  # the full model is in every table
    wide = rows.pivot(index="method", columns="task", values="value")
    order = list(dict.fromkeys(rows["task"]))
    wide = wide.reindex(columns=order)
    wide.columns = [f"paper_{task}" for task in wide.columns]
    return wide

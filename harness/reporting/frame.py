"""Run records as one pandas table: one row per run, its results and its configuration
flattened into dotted columns, for analysis beyond the reports (``harness.python_api``) and
for the reports' own tables (:func:`harness.reporting.tables.finished_records`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from harness.experiments.record import RunRecord

LEADING = ["run_id", "suite", "method", "label", "task", "seed", "student_shape", "status",
           "main_metric", "main_score", "teacher_main_score", "pct_of_teacher"]
"""The first columns, present even in an empty table; the dev metrics follow them."""
RESULTS = ["parameters.total", "parameters.non_embedding", "extra_parameters",
           "train_seconds", "train_examples_per_second", "wall_seconds", "inference.speedup",
           "peak_rss_mb", "data.fingerprint", "started_at", "finished_at", "error"]
"""Results and provenance after the dev metrics (empty where a run has none: a failed run
has no parameters, a finished one no error); the flattened ``config.*`` columns and the
annotations (``variation.*``, ``grid.*``, ``tuned.*``, ``tuning.*``) come last."""
ANNOTATIONS = ("variation", "grid", "tuned", "tuning")


def _row(record: RunRecord) -> dict[str, Any]:
    """The record as a nested mapping that :func:`pandas.json_normalize` flattens."""
    row: dict[str, Any] = {name: getattr(record, name) for name in LEADING if name != "label"}
    row["label"] = record.label()
    # split -> metric -> score: dev.accuracy, or MNLI's dev_matched.accuracy and
    # dev_mismatched.accuracy (the splits are named dev*, apart from every other column)
    row.update(record.dev or {})
    if record.parameters is not None:
        row["parameters"] = record.parameters.model_dump()
    for name in ("extra_parameters", "train_seconds", "train_examples_per_second",
                 "wall_seconds", "started_at", "finished_at", "error"):
        row[name] = getattr(record, name)
    if record.inference is not None:
        row["inference"] = {"speedup": record.inference.get("speedup")}
    row["peak_rss_mb"] = record.peak_rss_mb
    row["data"] = {"fingerprint": record.data.fingerprint}
    row["config"] = record.config
    for name in ANNOTATIONS:
        value = getattr(record, name)
        if value:
            row[name] = value
    return row


def records_to_frame(records: Iterable[RunRecord]) -> pd.DataFrame:
    """One row per record, in the order given: the columns of :data:`LEADING`, every dev
    metric as ``<split>.<metric>`` (``dev.accuracy``), the columns of :data:`RESULTS`, the
    resolved configuration the run id hashes as ``config.<key path>``
    (``config.stages.task.lr``), then what put the run in the store outside its id
    (``variation.*``, ``grid.*``, ``tuned.*``, ``tuning.*``). Lists stay lists."""
    flat = pd.json_normalize([_row(record) for record in records], sep=".")
    present = list(flat.columns)
    metrics = [column for column in present if column.split(".", 1)[0].startswith("dev")]
    config = [column for column in present if column.startswith("config.")]
    annotations = [column for column in present if column.split(".", 1)[0] in ANNOTATIONS]
    return flat.reindex(columns=[*LEADING, *metrics, *RESULTS, *config, *annotations])

"""Reading the runs' per-example dev predictions for reports and notebooks: which records'
files are missing or damaged, teacher-student agreement per task, and the predictions as
one long table (:mod:`harness.experiments.predictions` writes and checks the files)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.data.tasks import get_task
from harness.experiments.predictions import (
    Predictions,
    PredictionsError,
    SplitPredictions,
    load_predictions,
    predictions_path,
    read_predictions,
)
from harness.experiments.record import RunRecord

AGREEMENT_NOTE = (
    "Teacher-student agreement on the dev examples the main score is read from: the share "
    "of examples (%) where the student predicts the teacher's class, or for regression "
    "(STS-B) Pearson's r x 100 between the student's and the teacher's scores; mean over "
    "seeds, seeds in brackets.")


def agreement(student: SplitPredictions, teacher: SplitPredictions) -> float:
    """How far a student predicts what its teacher does on the same examples (matched by
    id): the share of examples with the same class (argmax of the logits), or for
    regression scores Pearson's r between the two (0 where either is constant)."""
    if student.ids.shape != teacher.ids.shape or not np.array_equal(
            np.sort(student.ids), np.sort(teacher.ids)):
        raise ValueError("the student's and the teacher's predictions are not on the same "
                         "examples")
    ours = student.predicted()[np.argsort(student.ids, kind="stable")]
    theirs = teacher.predicted()[np.argsort(teacher.ids, kind="stable")]
    if student.values.ndim != teacher.values.ndim:
        raise ValueError("one holds logits, the other regression scores")
    if student.values.ndim == 2:
        return float(np.mean(ours == theirs))
    ours, theirs = ours.astype(np.float64), theirs.astype(np.float64)
    if len(ours) < 2 or np.ptp(ours) == 0 or np.ptp(theirs) == 0:
        return 0.0
    return float(np.corrcoef(ours, theirs)[0, 1])


@dataclass
class PredictionsCheck:
    """What a set of records' predictions files hold."""

    problems: list[str] = field(default_factory=list)
    """One line per record whose file (its own or its teacher's) is missing or damaged."""
    without: int = 0
    """Records that name no predictions file (made before they were kept, or failed)."""
    agreement: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["label", "task", "seed", "agreement"]))
    """One row per run with both files readable: its teacher-student agreement (x100)."""


def check_predictions(records: Iterable[RunRecord], root: Path) -> PredictionsCheck:
    """Read every record's predictions and its teacher's from the store ``root``: the
    records whose files are missing or damaged are named, never left out silently."""
    check = PredictionsCheck()
    teachers: dict[str, Predictions | PredictionsError] = {}
    rows = []
    for record in records:
        if record.predictions is None:
            check.without += 1
            continue
        try:
            student = load_predictions(record, root)
            teacher = _teacher(record, root, teachers)
        except PredictionsError as error:
            check.problems.append(str(error))
            continue
        if teacher is None:
            continue
        split = get_task(record.task).selection_split
        rows.append({"label": record.label(), "task": record.task, "seed": record.seed,
                     "agreement": 100.0 * agreement(student[split], teacher[split])})
    if rows:
        check.agreement = pd.DataFrame(rows)
    return check


def _teacher(record: RunRecord, root: Path,
             read: dict[str, Predictions | PredictionsError]) -> Predictions | None:
    """The record's teacher's predictions (each teacher file read once); None when its
    record names none.  A file that is missing or damaged raises its error, with the run
    that reads it named."""
    summary = record.teacher.predictions
    if summary is None:
        return None
    if summary.sha256 not in read:
        try:
            path = predictions_path(record, root, teacher=True)
            read[summary.sha256] = read_predictions(
                path, summary, get_task(record.task).num_labels,
                f" (the {record.task} teacher {record.teacher.key[:16]})")
        except PredictionsError as error:
            read[summary.sha256] = error
    found = read[summary.sha256]
    if isinstance(found, PredictionsError):
        raise PredictionsError(f"{found}; read by run {record.run_id[:16]} ({record.method} "
                               f"{record.task} seed {record.seed})")
    return found


def agreement_table(agreements: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """Rows (the report's labels) by task: the mean agreement over seeds, with the number
    of seeds in brackets; empty when no run has predictions."""
    if agreements.empty:
        return pd.DataFrame()
    cells = agreements.groupby(["label", "task"])["agreement"].agg(["mean", "count"])
    present = [task for task in tasks if task in set(agreements["task"])]
    table = {"method": sorted(set(agreements["label"]))}
    for task in present:
        table[get_task(task).display_name] = [
            f"{cells.loc[(label, task), 'mean']:.2f} ({cells.loc[(label, task), 'count']})"
            if (label, task) in cells.index else "" for label in table["method"]]
    return pd.DataFrame(table)


def predictions_table(records: Iterable[RunRecord], root: Path, *,
                      teacher: bool = True) -> pd.DataFrame:
    """Every run's dev predictions, one row per (run, split, example): ``run_id``,
    ``method``, ``label``, ``task``, ``seed``, ``split``, ``example_id``, ``predicted``
    (the class, or the regression score), ``values`` (the logits as a list; the score)
    and, with ``teacher``, ``teacher_predicted``. Records that name no predictions file
    are left out and listed in ``attrs["without_predictions"]`` (their run ids); a file
    that is missing or damaged raises :class:`PredictionsError` naming it."""
    frames, without = [], []
    teachers: dict[str, Predictions | PredictionsError] = {}
    for record in records:
        if record.predictions is None:
            without.append(record.run_id)
            continue
        student = load_predictions(record, root)
        theirs = _teacher(record, root, teachers) if teacher else None
        for split, own in student.splits.items():
            frame = pd.DataFrame({
                "run_id": record.run_id, "method": record.method, "label": record.label(),
                "task": record.task, "seed": record.seed, "split": split,
                "example_id": own.ids, "predicted": own.predicted(),
                "values": list(own.values) if own.values.ndim == 2 else own.values})
            if theirs is not None:
                by_id = dict(zip(theirs[split].ids.tolist(), theirs[split].predicted(),
                                 strict=True))
                frame["teacher_predicted"] = [by_id.get(int(i)) for i in own.ids]
            frames.append(frame)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run_id", "method", "label", "task", "seed", "split", "example_id",
                 "predicted", "values"])
    table.attrs["without_predictions"] = without
    return table

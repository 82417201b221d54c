"""Per-example dev predictions of runs and teachers, kept in the results store.

A finished run writes its student's dev predictions beside its record, under the record's
stem with the suffix ``.predictions.npz``; the teacher it read has its own dev predictions
written once per suite, task and teacher key in ``<store>/<suite>/teachers/<task>-<teacher
key[:16]>.predictions.npz``. The record names each file with its sha256
(:class:`~harness.experiments.record.PredictionsSummary`); a reader checks the checksum and
the shapes before using one (:func:`load_predictions`), and a file that is missing or does
not match is a :class:`PredictionsError` naming it.

The file is a NumPy ``.npz`` archive (a zip of ``.npy`` arrays, no pickled objects) holding,
for every dev split, ``<split>.ids`` (int32: the data's own example ids, ``idx``) and
``<split>.values`` (float32: the logits, ``(examples, classes)``, or the regression scores,
``(examples,)``), in the split's row order. Its bytes depend on its arrays alone (fixed
entry order and timestamps), so the same predictions always have the same checksum.
"""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.common.files import write_bytes_atomic
from harness.common.paths import contained
from harness.data.tasks import TaskSpec
from harness.experiments.record import PREDICTIONS_FILE, PredictionsSummary, RunRecord

if TYPE_CHECKING:
    from harness.experiments.planner import PreparedTask

__all__ = ["PREDICTIONS_SUFFIX", "TEACHERS_FOLDER", "Predictions", "PredictionsError",
           "SplitPredictions", "encode_predictions", "example_ids", "load_predictions",
           "predictions_file", "predictions_path", "read_predictions",
           "teacher_predictions_name", "write_predictions"]

PREDICTIONS_SUFFIX = ".predictions.npz"
TEACHERS_FOLDER = "teachers"
"""The folder of a suite's store holding its teachers' predictions files."""
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
"""Every entry's timestamp: the archive's bytes depend on its arrays alone."""


class PredictionsError(ValueError):
    """A predictions file a record names that is missing, damaged or not what the record
    says (the message names the file and the record's run)."""


@dataclass(frozen=True)
class SplitPredictions:
    ids: np.ndarray
    """The data's example ids (``idx``), in the split's row order."""
    values: np.ndarray
    """Logits ``(examples, classes)`` or regression scores ``(examples,)``, float32."""

    def predicted(self) -> np.ndarray:
        """The predicted class per example (the argmax of the logits), or the score."""
        return self.values if self.values.ndim == 1 else self.values.argmax(axis=-1)


@dataclass(frozen=True)
class Predictions:
    path: Path
    kind: str
    """``logits`` or ``scores``."""
    splits: dict[str, SplitPredictions]

    def __getitem__(self, split: str) -> SplitPredictions:
        return self.splits[split]


def task_kind(task: TaskSpec) -> str:
    return "scores" if task.is_regression else "logits"


def encode_predictions(task: TaskSpec, splits: Mapping[str, tuple[np.ndarray, np.ndarray]]
                       ) -> tuple[bytes, PredictionsSummary]:
    """The file's bytes for ``splits`` (split -> (ids, logits as the model gave them)) and
    its summary, without its name (``file`` is filled in by :func:`write_predictions`)."""
    arrays: dict[str, np.ndarray] = {}
    for split, (ids, logits) in splits.items():
        values = np.asarray(logits, dtype=np.float32)
        if task.is_regression:
            values = values.reshape(len(values), -1)[:, 0]
        if len(np.asarray(ids)) != len(values):
            raise ValueError(f"{task.name} {split}: {len(ids)} ids for {len(values)} "
                             "predictions")
        arrays[f"{split}.ids"] = np.asarray(ids, dtype=np.int32)
        arrays[f"{split}.values"] = np.ascontiguousarray(values)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(arrays):
            entry = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(entry, "w") as handle:
                np.lib.format.write_array(handle, arrays[name], allow_pickle=False)
    data = buffer.getvalue()
    return data, PredictionsSummary.model_construct(
        file="", sha256=hashlib.sha256(data).hexdigest(), kind=task_kind(task),
        examples={split: len(ids) for split, (ids, _) in splits.items()})


def write_predictions(path: Path, task: TaskSpec,
                      splits: Mapping[str, tuple[np.ndarray, np.ndarray]]
                      ) -> PredictionsSummary:
    """Write the predictions file ``path`` atomically (a file already there with the same
    bytes is left as it is) and return the summary a record names it by."""
    data, summary = encode_predictions(task, splits)
    if not (path.is_file() and path.read_bytes() == data):
        write_bytes_atomic(path, data)
    return PredictionsSummary.model_validate(
        {**summary.model_dump(), "file": path.name})


def teacher_predictions_name(task: str, teacher_key: str) -> str:
    return f"{task}-{teacher_key[:16]}{PREDICTIONS_SUFFIX}"


def predictions_file(record_path: Path) -> Path:
    """A run's predictions file: beside its record, under the record's stem."""
    return record_path.with_name(record_path.stem + PREDICTIONS_SUFFIX)


def example_ids(prepared: PreparedTask, split: str) -> np.ndarray:
    """The data's own ids (``idx``) of ``split``'s examples, in row order."""
    return np.asarray(prepared.data.splits[split]["idx"], dtype=np.int64)


def predictions_path(record: RunRecord, root: Path, *, teacher: bool = False) -> Path:
    """Where the run's predictions file (``teacher``: its teacher's) is under the store
    ``root`` (a results root, or a suite's folder): in its place beside the record, else
    wherever in ``root`` a file of that name is; the place it should be when there is none.
    Raises :class:`PredictionsError` when the record names none."""
    summary = record.teacher.predictions if teacher else record.predictions
    if summary is None:
        raise PredictionsError(f"run {record.run_id[:16]} ({_who(record, teacher)}) names "
                               "no predictions file: a record made before they were kept")
    name = summary.file
    if re.fullmatch(PREDICTIONS_FILE, name) is None:  # the record model checks it too
        raise PredictionsError(f"run {record.run_id[:16]}: {name!r} is not a predictions "
                               "file name")
    folder = ((record.suite, TEACHERS_FOLDER) if teacher
              else (record.suite, record.method, record.task))
    places = [contained(root, *folder, name), contained(root, *folder[1:], name)]
    for place in places:
        if place.is_file():
            return place
    found = sorted(Path(root).glob(f"**/{name}"))
    return found[0] if found else places[0]


def _who(record: RunRecord, teacher: bool) -> str:
    run = f"{record.method} {record.task} seed {record.seed}"
    return f"the teacher of {run}" if teacher else run


def read_predictions(path: Path, summary: PredictionsSummary, num_labels: int,
                     what: str = "") -> Predictions:
    """The predictions in ``path``, checked against ``summary`` (its sha256, its splits and
    their sizes, its kind) and the task's ``num_labels``; a :class:`PredictionsError` naming
    the file otherwise."""
    def damaged(problem: str) -> PredictionsError:
        return PredictionsError(f"{path}: {problem}{what}")

    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise damaged("missing: the predictions file its record names is not there") from None
    except OSError as error:
        raise damaged(f"cannot be read ({error.strerror or error})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != summary.sha256:
        raise damaged(f"damaged: its sha256 is {digest[:16]}, its record names "
                      f"{summary.sha256[:16]}")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile) as error:
        raise damaged(f"not a predictions file ({error})") from None
    expected = {f"{split}.{part}" for split in summary.examples for part in ("ids", "values")}
    if set(arrays) != expected:
        raise damaged(f"holds {sorted(arrays)}, not {sorted(expected)}")
    splits = {}
    for split, examples in summary.examples.items():
        ids, values = arrays[f"{split}.ids"], arrays[f"{split}.values"]
        shape = (examples,) if summary.kind == "scores" else (examples, num_labels)
        if ids.shape != (examples,) or values.shape != shape or ids.dtype.kind != "i" \
                or values.dtype.kind != "f":
            raise damaged(f"{split}: ids {ids.dtype}{list(ids.shape)} and values "
                          f"{values.dtype}{list(values.shape)}, not int ids [{examples}] "
                          f"and float {summary.kind} {list(shape)}")
        splits[split] = SplitPredictions(ids, values)
    return Predictions(Path(path), summary.kind, splits)


def load_predictions(record: RunRecord, root: Path | str, *, teacher: bool = False
                     ) -> Predictions:
    """The run's dev predictions (``teacher``: its teacher's) from the store ``root``,
    checked (:func:`read_predictions`); a :class:`PredictionsError` naming the file and
    the run when the record names none or the file is missing or damaged."""
    from harness.data.tasks import get_task

    path = predictions_path(record, Path(root), teacher=teacher)
    summary = record.teacher.predictions if teacher else record.predictions
    assert summary is not None  # predictions_path refuses a record without one
    return read_predictions(path, summary, get_task(record.task).num_labels,
                            f" ({_who(record, teacher)}, run {record.run_id[:16]})")

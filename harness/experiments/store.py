"""Results store: one JSON record per run under ``results/``.

Records are :class:`~harness.experiments.record.RunRecord` documents named by the hash of
the run's resolved configuration and written atomically (temporary file, fsync, rename), so
re-running a configuration finds it finished and a process killed mid-way leaves no partial
record. Every record is validated when written and when read: a file that is not a valid
record is an error that names it.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from harness.common.files import write_json_atomic
from harness.common.paths import contained
from harness.experiments.record import RECORD_VERSION, RunRecord

__all__ = ["NESTED_STORES", "NOT_RUN_RECORDS", "RECORD_VERSION", "InvalidRecordError",
           "ResultsStore", "StoreNotWritableError"]

NESTED_STORES = ("tuning",)
"""Sub-folders of a results root holding stores of their own (a tuning study's trial runs):
a run found only there is not a run of the suite's leaderboard, so :meth:`find` skips them."""


NOT_RUN_RECORDS = ("bench",)
"""Sub-folders of a results root holding other documents (``harness bench`` records):
:meth:`records` of the root leaves them out."""


def _problem(problem: ErrorDetails) -> str:
    """One of a validation error's problems: a field's (its path, then pydantic's message),
    or the whole record's (a check across fields: its own message, without pydantic's
    "Value error, " and an empty path)."""
    if not problem["loc"]:
        context = problem.get("ctx") or {}
        return str(context.get("error", problem["msg"]))
    return f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}"


class InvalidRecordError(ValueError):
    """A file in the store that is not a run record (the message names it)."""


class StoreNotWritableError(ValueError):
    """A results folder a run's record cannot be written into (the message names it): a
    mistaken ``--results``, so not a failed run that a grid or tuning study goes on past."""


class ResultsStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def record_path(self, suite: str, method: str, task: str, name: str) -> Path:
        """``<root>/<suite>/<method>/<task>/<name>.json``; a part that would lead out of
        the store is refused (:class:`~harness.common.paths.PathEscapeError`)."""
        return contained(self.root, suite, method, task, f"{name}.json")

    def find(self, run_hash: str) -> Path | None:
        matches = [path for path in self.root.glob(f"**/*{run_hash[:16]}.json")
                   if path.relative_to(self.root).parts[0] not in NESTED_STORES]
        return matches[0] if matches else None

    def load(self, path: Path) -> RunRecord:
        try:
            return RunRecord.model_validate(json.loads(path.read_text()))
        except ValidationError as error:
            problems = "; ".join(_problem(problem) for problem in error.errors()[:5])
            raise InvalidRecordError(f"{path}: not a valid run record: {problems}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise InvalidRecordError(f"{path}: not a valid run record: {error}") from None
        except OSError as error:  # a folder named like a record, a file it cannot read
            raise InvalidRecordError(f"{path}: cannot read it as a run record "
                                     f"({error.strerror or error})") from None

    def check_writable(self, path: Path) -> None:
        """Stop before a run trains when its record ``path`` could not be written (a
        results path that is a file, a read-only folder), rather than after training."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".probe-"):
                pass
        except OSError as error:
            raise StoreNotWritableError(
                f"results store {self.root}: cannot write records into {path.parent} "
                f"({error.strerror or error}); pass a writable --results folder") from None

    def write(self, path: Path, record: RunRecord) -> Path:
        return write_json_atomic(path, record.document())

    def records(self, log: Callable[[str], None] | None = None) -> Iterator[RunRecord]:
        """Every run record under the root (a suite's folder, or a whole results root),
        nested tuning stores included, each run once.  A tuning trial run exactly as a
        grid's cell is one run in two stores: the record outside the nested store counts.
        Any other second file of one run id (a copy kept beside it, a store merged into
        another) is left out and named through ``log`` (default: a warning), so that no
        mean counts one run twice."""
        kept: dict[str, tuple[Path, RunRecord]] = {}
        for path in sorted(self.root.glob("**/*.json")):
            if path.name.startswith(".") or \
                    path.relative_to(self.root).parts[0] in NOT_RUN_RECORDS:
                continue
            record = self.load(path)
            if record.run_id not in kept:
                kept[record.run_id] = (path, record)
                continue
            first = kept[record.run_id][0]
            nested = [self._nested(one) for one in (first, path)]
            if nested[0] != nested[1]:  # a trial and a cell: the cell's record counts
                if nested[0]:
                    kept[record.run_id] = (path, record)
                continue
            message = (f"{path}: a second record of run {record.run_id[:16]} (the first: "
                       f"{first}); it is left out")
            if log is not None:
                log(message)
            else:
                warnings.warn(message, stacklevel=2)
        for _, record in sorted(kept.values(), key=lambda item: item[0]):
            yield record

    def _nested(self, path: Path) -> bool:
        """Whether ``path`` lies in a nested (tuning) store under the root."""
        return path.relative_to(self.root).parts[0] in NESTED_STORES

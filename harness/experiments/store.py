"""Results store: one JSON record per run under ``results/``.

Records are :class:`~harness.experiments.record.RunRecord` documents named by the hash of
the run's resolved configuration and written atomically (temporary file, fsync, rename), so
re-running a configuration finds it finished and a process killed mid-way leaves no partial
record. Every record is validated when written and when read: a file that is not a valid
record is an error that names it.

A run checks, before it trains, that its record can be written and that what it will
write fits on the disk (:func:`check_free_space`). A record that cannot be written anyway
(a disk filled meanwhile, a folder made read-only) is kept in a recovery copy
(:func:`recovery_paths`): in the cache folder's ``recovered/``, else in a folder of the
user's own in the system temp folder. The same run started again finds the copy and writes
it into the store without training (:meth:`ResultsStore.take_recovered`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from harness.common.files import write_json_atomic
from harness.common.paths import contained
from harness.config.identity import RECORD_VERSION, RecordVersionError, migrate_record
from harness.experiments.record import RunRecord

__all__ = ["NESTED_STORES", "NOT_RUN_RECORDS", "RECORD_BYTES", "RECORD_VERSION",
           "InvalidRecordError", "NotEnoughSpaceError", "RecordNotWrittenError",
           "ResultsStore", "StoreNotWritableError", "check_free_space", "recovery_paths"]

RECORD_BYTES = 1 << 20
"""Room a record needs on the disk, at most: a record holds its stages' histories and
stays far under it."""
RECOVERY_FOLDER = "recovered"
"""The cache folder's sub-folder holding records that could not be written into a store."""

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


class NotEnoughSpaceError(StoreNotWritableError):
    """A run whose record and cache entries would not fit on their disk: the message names
    the folder, the bytes free there and the bytes the run needs."""


class RecordNotWrittenError(StoreNotWritableError):
    """A run's record that could not be written into the store: the message names the
    recovery copy kept of it, which the same run started again stores without training."""


def check_free_space(needs: Iterable[tuple[Path, int, str]]) -> None:
    """Refuse (:class:`NotEnoughSpaceError`) when what a run will write does not fit.
    ``needs``: (folder, bytes, what) for each thing it writes; the needs of folders on one
    filesystem add up, and a folder not made yet is measured at its nearest parent."""
    totals: dict[int, tuple[Path, Path, int, list[str]]] = {}
    for folder, size, what in needs:
        existing = next(parent for parent in (folder, *folder.absolute().parents)
                        if parent.exists())
        device = existing.stat().st_dev
        first, measured, total, parts = totals.get(device, (folder, existing, 0, []))
        totals[device] = (first, measured, total + size, [*parts, f"{what} {size:,}"])
    for folder, measured, total, parts in totals.values():
        free = shutil.disk_usage(measured).free
        if free < total:
            raise NotEnoughSpaceError(
                f"not enough space in {folder}: {free:,} bytes free, the run needs about "
                f"{total:,} ({' + '.join(parts)}); make room there or pass another "
                "--results / --cache-dir")


def recovery_paths(cache_root: Path, run_id: str) -> list[Path]:
    """Where a record of run ``run_id`` that could not be written is kept, in order of
    preference: ``<cache>/recovered/<run id>.json``, then a folder only this user can
    write in the system temp folder (for a cache on the same full disk)."""
    if re.fullmatch(r"[0-9a-f]{64}", run_id) is None:
        raise ValueError(f"{run_id!r} is not a run id")
    name = f"{run_id}.json"
    return [Path(cache_root) / RECOVERY_FOLDER / name, _temp_recovery_folder() / name]


def _temp_recovery_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"distill-bench-{RECOVERY_FOLDER}-{os.getuid()}"


def _trusted(copy: Path, create: bool = False) -> bool:
    """Whether ``copy``'s folder may hold a recovery copy: any folder but the system temp
    folder's, which must be a folder (not a link) of this user's that no one else can
    write (``create``: made so when absent)."""
    folder = copy.parent
    if folder != _temp_recovery_folder():
        return True
    if create:
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            return False
    try:
        status = folder.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()
            and not status.st_mode & 0o022)


def _score(record: RunRecord) -> str:
    if record.main_score is None:
        return ""
    return f"; its dev {record.main_metric} is {record.main_score:.2f}"


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
            return RunRecord.model_validate(migrate_record(json.loads(path.read_text())))
        except RecordVersionError as error:
            raise InvalidRecordError(f"{path}: not a valid run record: {error}") from None
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
        results path that is a file, a read-only folder, a disk without room for a
        record), rather than after training."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".probe-"):
                pass
        except OSError as error:
            raise StoreNotWritableError(
                f"results store {self.root}: cannot write records into {path.parent} "
                f"({error.strerror or error}); pass a writable --results folder") from None
        check_free_space([(path.parent, RECORD_BYTES, "its record")])

    def write(self, path: Path, record: RunRecord) -> Path:
        return write_json_atomic(path, record.document())

    def write_or_keep(self, path: Path, record: RunRecord, copies: list[Path]) -> Path:
        """Write ``record`` to ``path``; when it cannot be written (a full disk, a read-only
        folder), keep it in the first of ``copies`` (:func:`recovery_paths`) that can be
        written and raise :class:`RecordNotWrittenError` naming it."""
        try:
            return self.write(path, record)
        except OSError as error:
            reason = error.strerror or str(error)
        refusals = []
        for copy in copies:
            try:
                if not _trusted(copy, create=True):
                    raise OSError(f"{copy.parent} is not a private folder of this user's")
                write_json_atomic(copy, record.document())
            except OSError as error:
                refusals.append(f"{copy}: {error.strerror or error}")
                continue
            raise RecordNotWrittenError(
                f"{path}: the run's record could not be written ({reason}){_score(record)}; "
                f"it is kept in {copy}: make room and run the same command again, which "
                "stores it without training")
        raise RecordNotWrittenError(
            f"{path}: the run's record could not be written ({reason}), nor kept "
            f"({'; '.join(refusals)}){_score(record)}")

    def take_recovered(self, path: Path, run_id: str, copies: list[Path]
                       ) -> tuple[RunRecord, Path] | None:
        """The record of ``run_id`` that a run could not write and kept in one of
        ``copies`` (:func:`recovery_paths`), now written to ``path``, its copy removed;
        None when there is none.  A copy that is not a record of this run is an
        :class:`InvalidRecordError` naming it; a copy that cannot be written into the store
        still is a :class:`RecordNotWrittenError`, and stays."""
        for copy in copies:
            if not copy.is_file() or not _trusted(copy):
                continue
            record = self.load(copy)
            if record.run_id != run_id:
                raise InvalidRecordError(
                    f"{copy}: a recovery copy of run {record.run_id[:16]}, not of run "
                    f"{run_id[:16]} whose name it has; move it away to run this one")
            try:
                self.write(path, record)
            except OSError as error:
                raise RecordNotWrittenError(
                    f"{path}: the record kept in {copy} could not be written into the "
                    f"store either ({error.strerror or error}){_score(record)}; make room "
                    "and run the same command again") from None
            copy.unlink()
            return record, copy
        return None

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

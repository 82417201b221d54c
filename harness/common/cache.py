"""Content-addressed cache of expensive artefacts (fine-tuned teachers and their outputs).

An entry is a directory named by the hash of everything that determines its content.  It
is built in a temporary sibling directory and renamed into place only when complete, so a
process killed mid-way never leaves an entry that looks finished.  Several processes may
build the same entry at once (workers sharing a cache, the processes of one launch): the
first to finish puts its copy in place and the others discard theirs, so a finished entry
is never replaced under a process reading it.

Each entry records the size and SHA-256 of every file it holds (``key.json``, ``files``).
The first time a process uses an entry it checks them: a truncated, missing or altered
file, an entry written for another key (copied or moved in under this one), or an entry
made from another build of the entry it derives from (teacher outputs whose teacher was
rebuilt since, with other weights), makes the entry damaged; it is reported, moved out of
the way and rebuilt, never read.

An entry without checksums is used only when it predates them, as its ``key.json`` says:
every entry since records ``entry_format`` (:data:`ENTRY_FORMAT`), and one that records it
but no ``files`` (its checksums removed) is damaged.  An entry that records no
``entry_format`` and no checksums, written before checksums existed, has them recorded on
first use, once its arrays load and hold finite numbers, its weights load and its JSON
files parse (else it is damaged too); one that holds JSON lines (augmented copies, POS
tags) is rebuilt, as a file of them cut at a line's end would read as whole.  An entry
written with checksums but before ``entry_format`` existed has it recorded the first time
its checksums are found whole, so that a later removal of them shows.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.files import write_json_atomic
from harness.common.paths import contained

CACHE_VERSION = 1
ENTRY_FORMAT = 2
"""What each entry's ``key.json`` records as ``entry_format``: 2, it records the size and
SHA-256 of every file (``files``).  An entry that records none was written before
checksums (1), or with them before the field existed (then it has ``files``)."""


def default_cache_dir() -> Path:
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "distill-bench"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def file_digest(path: Path, chunk_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


DESCRIPTION = "key.json"
BUILD_NOTES = frozenset({"summary.json"})
"""An entry's notes on its build (timings) that :meth:`ArtifactCache.files_digest` leaves
out: two builds of the same contents differ there."""
MARKER = "COMPLETE"


def file_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file under ``folder`` but the entry's own bookkeeping."""
    return {path.relative_to(folder).as_posix(): {"size": path.stat().st_size,
                                                  "sha256": file_digest(path)}
            for path in sorted(folder.rglob("*"))
            if path.is_file() and path.relative_to(folder).as_posix() not in {DESCRIPTION,
                                                                              MARKER}}


def _is_manifest(recorded: Any) -> bool:
    """Whether ``key.json``'s ``files`` has the shape :func:`file_manifest` writes (a file
    edited by hand may not: it is then damaged, not a reason to stop with a traceback)."""
    return isinstance(recorded, dict) and all(
        isinstance(name, str) and isinstance(item, dict)
        and isinstance(item.get("size"), int) and isinstance(item.get("sha256"), str)
        for name, item in recorded.items())


def _entry_format(description: dict[str, Any]) -> int:
    """The ``entry_format`` ``key.json`` records (1: none, written before the field)."""
    recorded = description.get("entry_format", 1)
    return recorded if isinstance(recorded, int) else ENTRY_FORMAT


def _readable_problems(entry: Path) -> list[str]:
    """What reading an entry that has no recorded checksums shows: arrays that do not load
    or hold non-finite numbers (no logit or hidden state is NaN), weights (safetensors, a
    torch state) that do not load, JSON that does not parse, and any JSON lines (a file
    of them cut at a line's end still parses: only checksums would catch that).  Without
    this a damaged old entry would have its checksums recorded and be trusted."""
    import torch
    from safetensors import SafetensorError, safe_open

    problems = []
    for path in sorted(entry.rglob("*")):
        name = path.relative_to(entry).as_posix()
        if not path.is_file() or name in {DESCRIPTION, MARKER}:
            continue
        try:
            if path.suffix == ".npy":
                array = np.load(path, mmap_mode="r")
                if array.dtype.kind == "f" and not _all_finite(array):
                    problems.append(f"{name} holds non-finite numbers")
            elif path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".jsonl":
                # Cut at a line's end, JSON lines still parse: only checksums would show
                # the loss.  What such entries hold (augmented copies, POS tags) is remade
                # in seconds to minutes, so it is remade rather than trusted.
                problems.append(f"{name} holds JSON lines written before checksums (a file "
                                "cut at a line's end would read as whole)")
            elif path.suffix == ".safetensors":
                with safe_open(path, framework="pt") as weights:
                    for tensor in weights.keys():  # noqa: SIM118 (no iterator of its own)
                        weights.get_tensor(tensor)
            elif path.suffix == ".pt":
                torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError,
                SafetensorError) as error:
            detail = (str(error).strip().splitlines() or [""])[0]
            problems.append(f"{name} unreadable ({detail})")
    return problems


def _all_finite(array: np.ndarray, block: int = 1 << 24) -> bool:
    """Whether a (memory-mapped) float array holds only finite numbers, read in blocks so
    that a multi-GB entry of teacher hidden states needs no mask of its own size."""
    flat = array.reshape(-1)
    return all(np.isfinite(flat[start:start + block]).all()
               for start in range(0, flat.size, block))


def _log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class CacheNotUsableError(ValueError):
    """The cache folder cannot hold entries (the message says why and what to pass)."""


class ArtifactCache:
    def __init__(self, root: Path, log: Callable[[str], None] = _log_to_stderr) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():  # found before any work, not after
            raise CacheNotUsableError(f"cache folder {self.root} is a file: pass a folder as "
                                      "--cache-dir")
        self.log = log
        self._checked: set[tuple[str, str]] = set()

    def path(self, kind: str, key: str) -> Path:
        """The entry's folder, ``<root>/<kind>/<key>``; a kind or key that would lead out
        of the cache is refused (:class:`~harness.common.paths.PathEscapeError`)."""
        return contained(self.root, kind, key)

    def has(self, kind: str, key: str) -> bool:
        """Whether the entry is complete and whole.  The first call for an entry in a
        process checks its files against their recorded sizes and checksums; a damaged
        entry is reported and removed, so the caller rebuilds it."""
        if not (self.path(kind, key) / MARKER).exists():
            return False
        if (kind, key) in self._checked:
            return True
        problems = self.problems(kind, key)
        if problems is None:
            self._record_manifest(kind, key)
        elif not problems:
            self._record_entry_format(kind, key)
        else:
            self.log(f"[cache] {kind}/{key[:16]} is damaged ({'; '.join(problems[:5])}); "
                     "rebuilding it")
            self._discard(kind, key)
            return False
        self._checked.add((kind, key))
        return True

    def problems(self, kind: str, key: str) -> list[str] | None:
        """What differs between the entry's files and what was recorded when it was
        written (empty: nothing), an entry written for another key included; for an entry
        written before checksums, what reading its files shows, or None when nothing (its
        checksums are then recorded)."""
        entry = self.path(kind, key)
        try:
            description = json.loads((entry / DESCRIPTION).read_text())
            recorded, written_for = description.get("files"), description.get("key", key)
        except (OSError, ValueError, AttributeError) as error:
            return [f"{DESCRIPTION} unreadable ({error})"]
        if written_for != key:
            # Whole and self-consistent, but another key's: an entry copied or moved under
            # this name (a synced or merged cache) holds another teacher's or task's files.
            return [f"it holds the entry of another key ({str(written_for)[:16]})"]
        made_from = description.get("made_from")
        if isinstance(made_from, dict) and (changed := self.changed_source(made_from)):
            # The source was rebuilt (damaged, deleted) with other contents: a teacher
            # fine-tuned again on another thread count has other weights.
            return [f"it was made from {changed}"]
        if recorded is None and _entry_format(description) >= ENTRY_FORMAT:
            return [f"{DESCRIPTION} records no checksums, though its entry_format "
                    f"{description['entry_format']} says they were written"]
        if recorded is None:
            return _readable_problems(entry) or None
        if not _is_manifest(recorded):
            return [f"{DESCRIPTION} unreadable (its files record is not a size and sha256 "
                    "per file)"]
        problems = []
        for name, expected in recorded.items():
            path = entry / name
            if not path.is_file():
                problems.append(f"{name} is missing")
            elif (size := path.stat().st_size) != expected["size"]:
                problems.append(f"{name} has {size} bytes, {expected['size']} were written")
            elif file_digest(path) != expected["sha256"]:
                problems.append(f"{name} was altered (its checksum differs)")
        return problems

    def source_digests(self, made_from: Iterable[tuple[str, str]]) -> dict[str, str | None]:
        """``kind/key`` -> :meth:`files_digest` of each entry (kind, key): what something
        made from them records, for :meth:`changed_source` to compare later."""
        return {f"{kind}/{key}": self.files_digest(kind, key) for kind, key in made_from}

    def changed_source(self, recorded: dict[str, str | None], removed: bool = False
                       ) -> str | None:
        """The first source of ``recorded`` (:meth:`source_digests` when it was used) that
        now holds another build, as "another build of kind/key"; None when each is the
        same.  A source recorded without a digest (written before checksums) is taken as
        it is; one no longer cached counts as changed only with ``removed``, which also
        says which of the two it is."""
        for source, digest in recorded.items():
            kind, _, key = str(source).partition("/")
            now = self.files_digest(kind, key)
            if digest is None or now == digest or (now is None and not removed):
                continue
            state = ("since rebuilt with other contents" if now is not None
                     else "no longer cached")
            return f"another build of {kind}/{key[:16]}" + (f" ({state})" if removed else "")
        return None

    def files_digest(self, kind: str, key: str) -> str | None:
        """A digest of the files entry ``kind/key`` recorded when it was written, but its
        notes on the build (:data:`BUILD_NOTES`: a source made again with the same weights
        and outputs is the same source); None: no such entry, or one written before
        checksums.  What an entry made from it records (``build(made_from=...)``), so that
        a source rebuilt with other contents shows."""
        try:
            description = json.loads((self.path(kind, key) / DESCRIPTION).read_text())
        except (OSError, ValueError):
            return None
        files = description.get("files") if isinstance(description, dict) else None
        if not _is_manifest(files):
            return None
        return content_hash({name: item for name, item in files.items()
                             if name not in BUILD_NOTES})

    def _record_manifest(self, kind: str, key: str) -> None:
        entry = self.path(kind, key)
        description = json.loads((entry / DESCRIPTION).read_text())
        description["files"] = file_manifest(entry)
        description["entry_format"] = ENTRY_FORMAT
        write_json_atomic(entry / DESCRIPTION, description)
        self.log(f"[cache] {kind}/{key[:16]}: written before checksums; recorded them now")

    def _record_entry_format(self, kind: str, key: str) -> None:
        """Record :data:`ENTRY_FORMAT` in a whole entry written before the field existed
        (best effort: a cache on a read-only disk is used as it is)."""
        path = self.path(kind, key) / DESCRIPTION
        try:
            description = json.loads(path.read_text())
            if _entry_format(description) < ENTRY_FORMAT:
                write_json_atomic(path, {**description, "entry_format": ENTRY_FORMAT})
        except (OSError, ValueError, AttributeError):
            pass

    def _discard(self, kind: str, key: str) -> None:
        """Move a damaged entry aside (one rename: readers never see half of it), then
        delete it."""
        entry = self.path(kind, key)
        aside = entry.with_name(f".damaged-{key[:12]}-{os.getpid()}")
        with self._lock(kind, key):
            if entry.exists():
                os.replace(entry, aside)
        shutil.rmtree(aside, ignore_errors=True)

    @contextmanager
    def _lock(self, kind: str, key: str) -> Iterator[None]:
        """One process at a time puts an entry in place or takes it away."""
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{kind}-{key}", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @contextmanager
    def producing(self, kind: str, key: str, exclusive: bool = True) -> Iterator[None]:
        """Held while a process makes the entry ``kind/key`` (a teacher, a general
        checkpoint: minutes to hours).  Another process that needs the same entry (a
        second grid worker) waits here instead of making it a second time, and then finds
        it made.  ``exclusive=False`` holds nothing: the processes of one distributed
        launch make an entry together, so none of them may wait for another."""
        if not exclusive:
            yield
            return
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        # Its own lock file: build() takes the entry's lock to put it in place.
        with open(locks / f"producing-{kind}-{key}", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.log(f"[cache] {kind}/{key[:16]} is being made by another process; "
                         "waiting for it")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @contextmanager
    def build(self, kind: str, key: str, description: dict[str, Any],
              replace: bool = False, made_from: Iterable[tuple[str, str]] = ()
              ) -> Iterator[Path]:
        """Yield a scratch directory; on success it becomes the entry ``kind/key``, unless
        another process completed that entry meanwhile: then the scratch copy is dropped
        and the finished entry kept.  ``replace``: this copy takes the finished entry's
        place instead (an entry that is one run's output, not an artefact any build
        reproduces: a kept student).  ``made_from``: the entries (kind, key) this one is
        computed from; their files' digests are recorded, and the entry counts as damaged
        once one of them is rebuilt with other contents."""
        sources = self.source_digests(made_from)
        final = self.path(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        aside = final.with_name(f".replaced-{key[:12]}-{os.getpid()}")
        try:
            yield scratch
            (scratch / DESCRIPTION).write_text(json.dumps(
                {"key": key, "cache_version": CACHE_VERSION, **description,
                 **({"made_from": sources} if sources else {}),
                 "entry_format": ENTRY_FORMAT, "files": file_manifest(scratch)}, indent=2,
                default=str))
            (scratch / MARKER).write_text("")
            # Under the lock: no window between keeping a finished entry and putting this
            # one in place.
            with self._lock(kind, key):
                if replace and (final / MARKER).exists():
                    os.replace(final, aside)  # one rename: readers never see half of it
                if not (final / MARKER).exists():
                    if final.exists():  # an incomplete leftover from a killed process
                        shutil.rmtree(final)
                    os.replace(scratch, final)
                    self._checked.add((kind, key))
        finally:
            for leftover in (scratch, aside):
                if leftover.exists():
                    shutil.rmtree(leftover, ignore_errors=True)

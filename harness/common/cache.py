"""Content-addressed cache of expensive artefacts (fine-tuned teachers and their outputs).

An entry is a directory named by the hash of everything that determines its content.  It
is built in a temporary sibling directory and renamed into place only when complete, so a
process killed mid-way never leaves an entry that looks finished.  Several processes may
build the same entry at once (workers sharing a cache, the processes of one launch): the
first to finish puts its copy in place and the others discard theirs, so a finished entry
is never replaced under a process reading it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CACHE_VERSION = 1


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


class ArtifactCache:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def has(self, kind: str, key: str) -> bool:
        return (self.path(kind, key) / "COMPLETE").exists()

    @contextmanager
    def build(self, kind: str, key: str, description: dict[str, Any]) -> Iterator[Path]:
        """Yield a scratch directory; on success it becomes the entry ``kind/key``, unless
        another process completed that entry meanwhile: then the scratch copy is dropped
        and the finished entry kept."""
        final = self.path(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        try:
            yield scratch
            (scratch / "key.json").write_text(json.dumps(
                {"key": key, "cache_version": CACHE_VERSION, **description}, indent=2,
                default=str))
            (scratch / "COMPLETE").write_text("")
            # One process at a time decides between keeping a finished entry and putting
            # this one in place: no window between the check and the rename.
            locks = self.root / ".locks"
            locks.mkdir(exist_ok=True)
            with open(locks / f"{kind}-{key}", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not self.has(kind, key):
                    if final.exists():  # an incomplete leftover from a killed process
                        shutil.rmtree(final)
                    os.replace(scratch, final)
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)

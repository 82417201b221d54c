"""Content-addressed cache of expensive artefacts (fine-tuned teachers and their outputs).

An entry is a directory named by the hash of everything that determines its content.  It
is built in a temporary sibling directory and renamed into place only when complete, so a
process killed mid-way never leaves an entry that looks finished.
"""

from __future__ import annotations

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
        """Yield a scratch directory; on success it becomes the entry ``kind/key``."""
        final = self.path(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        try:
            yield scratch
            (scratch / "key.json").write_text(json.dumps(
                {"key": key, "cache_version": CACHE_VERSION, **description}, indent=2,
                default=str))
            (scratch / "COMPLETE").write_text("")
            if final.exists():  # an incomplete leftover from a killed process
                shutil.rmtree(final)
            os.replace(scratch, final)
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)

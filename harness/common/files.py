"""Writing a file so that a reader never sees half of it."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FILE_MODE = 0o644
"""What an atomically written file is made readable as (mkstemp's 0600 would hide it from
other users)."""


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path in ``path``'s folder, with ``path``'s suffix, for a library that
    writes to a path (matplotlib's ``savefig``, pandas' ``to_csv``, safetensors'
    ``save_file``).  When the block ends the file is flushed to disk and renamed over
    ``path``; when it raises (a full disk, a failed render) the temporary file is removed
    and ``path`` is left as it was: the previous file whole, or none, never part of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix, dir=path.parent)
    temporary = Path(name)
    try:
        try:
            os.fchmod(descriptor, FILE_MODE)
        finally:
            os.close(descriptor)
        yield temporary
        _flush_to_disk(temporary)
        os.replace(temporary, path)
        _flush_folder(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, flushed to
    disk and renamed over the target (:func:`atomic_path`)."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_bytes_atomic`): a process
    killed mid-way or a full disk leaves the previous file, or none, never a partial one,
    and a reader never sees half of it."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def _flush_to_disk(path: Path) -> None:
    """Flush what was written to ``path`` (by whatever library wrote it) to the disk, so
    that a rename over the target never leaves an empty file after a power loss."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _flush_folder(folder: Path) -> None:
    """Flush the folder's entries (the rename) to the disk where the filesystem allows."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:  # some filesystems refuse fsync on a folder
        pass
    finally:
        os.close(descriptor)


def write_json_atomic(path: Path, document: Any) -> Path:
    """Write ``document`` as JSON to ``path`` atomically (:func:`write_text_atomic`).
    Non-finite numbers (a failed run's NaN loss) are written as the strings ``"nan"``,
    ``"inf"`` and ``"-inf"``: strict JSON, which every reader accepts and pydantic reads
    back as floats."""
    return write_text_atomic(path, json.dumps(_strict_json(document), indent=2,
                                              sort_keys=False, default=str, allow_nan=False))


def _strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its name (``nan``, ``inf``,
    ``-inf``), which JSON has no literal for."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(item) for item in value]
    return value


HUB_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def offline_variables(names: tuple[str, ...] = HUB_OFFLINE_VARIABLES) -> list[str]:
    """Which of the Hugging Face offline switches are set (as the hub libraries read them:
    1, true or yes), for messages that say why the hub was not asked."""
    return [name for name in names
            if os.environ.get(name, "").strip().lower() in {"1", "true", "yes"}]

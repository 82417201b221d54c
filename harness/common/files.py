"""Writing a file so that a reader never sees half of it."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, flushed to
    disk and renamed over the target: a process killed mid-way (or a full disk) leaves the
    previous file, or none, never a partial one, and a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix,
                                             dir=path.parent)
    try:
        os.fchmod(descriptor, 0o644)  # mkstemp's 0600 would hide the file from other users
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


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

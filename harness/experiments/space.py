"""What a run will write to the disk, estimated before it trains, so that a run that cannot
fit stops at once instead of failing on its record after hours of training.

The estimate counts the run's record (:data:`~harness.experiments.store.RECORD_BYTES`)
and the cache entries it will make that the cache does not hold yet, from the parameter
counts of the models (built on PyTorch's meta device: no memory, no weights): the task's
fine-tuned teacher, the general checkpoint of a method with corpus stages (with the
progress it saves on the way) and, with ``--save-students``, the kept student. Augmented
copies are not counted; the teacher's intermediate-output cache checks its own size
against the free space when it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig

from harness.api.method import Method, Stage
from harness.api.students import classifier_config, new_sequence_classifier, student_config
from harness.common.cache import MARKER, ArtifactCache
from harness.config.schema import StudentConfig, TrainConfig
from harness.data.tasks import TaskSpec
from harness.experiments.planner import PreparedTask, RunPlanner
from harness.experiments.store import RECORD_BYTES

WEIGHT_BYTES = 4
"""Bytes of a saved parameter (float32)."""
ENTRY_BYTES = 16 << 20
"""A cache entry's files beside its weights: tokenizer, logits, summaries."""
GENERAL_COPIES = 8
"""Copies of the student's weights a general checkpoint takes while it is made: its body and
extra modules, and its saved progress (weights and two Adam moments), twice while a save
replaces the previous one."""
KEPT_COPIES = 2
"""Copies of the student's weights a kept student takes (the weights, and room for a
method's own format)."""

GeneralKey = Callable[[Method, StudentConfig, list[Stage], dict[str, TrainConfig]], str]
"""The cache key of the general checkpoint a method's corpus stages make for a shape."""


def parameter_count(config: PretrainedConfig) -> int:
    """Parameters of the sequence classifier ``config`` describes, built on the meta
    device (shapes only)."""
    with torch.device("meta"):
        model = new_sequence_classifier(config)
    return sum(parameter.numel() for parameter in model.parameters())


def space_needed(planner: RunPlanner, cache: ArtifactCache, method: Method,
                 prepared: PreparedTask, spec: dict[str, Any],
                 stage_configs: dict[str, TrainConfig], record: Path, *,
                 general_key: GeneralKey, keep_student: bool
                 ) -> list[tuple[Path, int, str]]:
    """(folder, bytes, what) for each thing the run of ``spec`` will write: its
    ``record``, and the cache entries it makes that ``cache`` lacks (for
    :func:`~harness.experiments.store.check_free_space`)."""
    task = prepared.task
    needs = [(record.parent, RECORD_BYTES, "its record")]
    teacher = parameter_count(classifier_config(planner.teacher_config, task))
    if not _cached(cache, "teachers", planner.teacher_key(prepared)):
        needs.append((cache.root, WEIGHT_BYTES * teacher + ENTRY_BYTES,
                      f"the {task.name} teacher"))
    shape_name = spec["student"]["name"]
    student = _student_parameters(planner, shape_name, task, teacher)
    key = _general_key(planner, method, task, shape_name, spec, stage_configs, general_key)
    if key is not None and not _cached(cache, "general", key):
        needs.append((cache.root, GENERAL_COPIES * WEIGHT_BYTES * student + ENTRY_BYTES,
                      "its general checkpoint"))
    if keep_student:
        needs.append((cache.root, KEPT_COPIES * WEIGHT_BYTES * student + ENTRY_BYTES,
                      "the kept student"))
    return needs


def _cached(cache: ArtifactCache, kind: str, key: str) -> bool:
    return (cache.path(kind, key) / MARKER).exists()


def _student_parameters(planner: RunPlanner, shape_name: str, task: TaskSpec,
                        teacher: int) -> int:
    """The student's parameters: a BERT-family shape's exactly; another kind's (built by
    its method alone) taken as the teacher's."""
    shape = planner.student_shape(shape_name)
    if not isinstance(shape, StudentConfig):
        return teacher
    pooling = planner.student_pooling(shape_name) or "pooler"
    return parameter_count(student_config(shape, planner.teacher_config, task, pooling))


def _general_key(planner: RunPlanner, method: Method, task: TaskSpec, shape_name: str,
                 spec: dict[str, Any], stage_configs: dict[str, TrainConfig],
                 general_key: GeneralKey) -> str | None:
    """The key of the general checkpoint the run starts from (its method's corpus stages,
    or another method's with ``init_from``); None when it starts from none."""
    stages = [stage for stage in method.stages(task) if stage.is_general]
    shape = planner.student_shape(shape_name)
    if not isinstance(shape, StudentConfig):
        return None
    if stages:
        return general_key(method, shape, stages, stage_configs)
    if "general" in spec:
        source, source_stages, source_configs = planner.general_source(
            spec["general"]["from"], task, shape_name, where=spec["method"])
        return general_key(source, shape, source_stages, source_configs)
    return None

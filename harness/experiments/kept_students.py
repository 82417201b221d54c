"""Trained students kept for export: ``harness run --save-students`` puts each run's
student (the best checkpoint of its last stage, the weights its dev score was measured on)
in the artefact cache as ``students/<run id>`` with the score it reached."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from harness.common.cache import ArtifactCache
from harness.data.tasks import TaskSpec

STUDENT_KIND = "students"
STUDENT_FILE = "student.json"
"""What a kept student is: its kind, the run it comes from and the score it reached."""


def keep_student(cache: ArtifactCache, run_id: str, student: torch.nn.Module, *,
                 tokenizer: PreTrainedTokenizerBase | None, task: TaskSpec, max_length: int,
                 method: str, main_score: float, plugin: str | None = None,
                 save: Callable[[Path], bool] | None = None,
                 made_from: Iterable[tuple[str, str]] = ()) -> Path:
    """Put the trained ``student`` in the cache as ``students/<run_id>`` with the score it
    reached: a Transformers student with its tokenizer; any other in its method's own
    format when ``save`` (the plugin's :meth:`~harness.api.Method.save_student`, bound to
    the student) writes one, whose ``plugin`` then loads it back; else as a state dict.
    It replaces a student kept by an earlier training of the same run (another results
    store, thread count or machine), which its record may not have measured.
    ``made_from``: the cache entries the student was trained from (the teacher, a general
    checkpoint, augmented copies): once one of them is rebuilt with other contents, the
    kept student counts as damaged and :func:`kept_student` no longer gives it."""
    with cache.build(STUDENT_KIND, run_id, {"run_id": run_id, "method": method,
                                             "task": task.name}, replace=True,
                     made_from=made_from) as folder:
        if isinstance(student, PreTrainedModel) and tokenizer is not None:
            _name_labels(student.config, task)
            student.save_pretrained(folder, safe_serialization=True)
            tokenizer.save_pretrained(folder)
            _truncate_at(folder, max_length)
            kind = "transformers"
        elif save is not None and save(folder):
            kind = "plugin"
        else:
            state = {name: tensor.detach().contiguous()
                     for name, tensor in student.state_dict().items()}
            save_file(state, str(folder / "model.safetensors"))
            kind = "state_dict"
        (folder / STUDENT_FILE).write_text(json.dumps({
            "kind": kind, "class": f"{type(student).__module__}.{type(student).__qualname__}",
            "run_id": run_id, "method": method, "plugin": plugin, "task": task.name,
            "max_length": max_length, "main_score": main_score}, indent=2))
    return cache.path(STUDENT_KIND, run_id)


def kept_student(cache: ArtifactCache, run_id: str) -> Path | None:
    """The kept student of ``run_id`` (checked against its checksums), None if absent."""
    return cache.path(STUDENT_KIND, run_id) if cache.has(STUDENT_KIND, run_id) else None


def _name_labels(config: Any, task: TaskSpec) -> None:
    if task.is_regression:
        config.id2label, config.label2id = {0: "score"}, {"score": 0}
        config.problem_type = "regression"
    else:
        config.id2label = dict(enumerate(task.label_names))
        config.label2id = {name: index for index, name in enumerate(task.label_names)}
        config.problem_type = "single_label_classification"


def _truncate_at(folder: Path, max_length: int) -> None:
    """The tokenizer truncates where the run did: ``tokenizer(a, b, truncation=True)``
    then gives the run's features."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["model_max_length"] = max_length
    path.write_text(json.dumps(config, indent=2))

"""The engine's tests train a method's first stage on a random BERT student of a few
layers (hidden 16, 4 heads), on rows of random RTE ids, with one seed for its weights and
another for the batches: one helper, so that each test says only what it varies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from accelerate import Accelerator

from harness.api.context import StudentContext
from harness.api.method import Method
from harness.config.schema import StudentConfig, TrainConfig
from harness.data.features import EncodedSplit
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task
from harness.teacher.outputs import TeacherRuntime
from harness.training.engine import StageCheckpoint, StageResult, train_stage
from tests.teacher.test_intermediate_cache import teacher_config, tiny_split

TASK = get_task("rte")


@dataclass
class TinyRun:
    """The student's weights before and after the stage, and what the stage returned."""

    before: list[torch.Tensor]
    after: list[torch.Tensor]
    result: StageResult

    def changes(self) -> list[torch.Tensor]:
        return [after - before for after, before in zip(self.after, self.before, strict=True)]


def train_tiny_student(method: Method, config: TrainConfig, *, layers: int = 1,
                       train_split: EncodedSplit | None = None,
                       eval_split: EncodedSplit | None = None,
                       dropout_seed: int | None = None,
                       checkpoint: StageCheckpoint | None = None,
                       log: Callable[[str], None] = lambda line: None) -> TinyRun:
    """``method``'s first stage on a fresh student (weights from seed 1; ``dropout_seed``:
    reseed after building, so that dropout draws from there), batches from seed 3, on
    ``train_split`` (default: 20 rows)."""
    shape = StudentConfig(num_layers=layers, hidden_size=16, num_heads=4, intermediate_size=32)
    context = StudentContext(task=TASK, shape_name="tiny", shape=shape,
                             teacher_config=teacher_config())
    torch.manual_seed(1)
    student = method.build_student(context)
    before = [p.detach().clone() for p in student.parameters()]
    if dropout_seed is not None:
        torch.manual_seed(dropout_seed)
    result = train_stage(method=method, stage=method.stages(TASK)[0], student=student,
                         extra=method.extra_modules(context), config=config,
                         train_split=train_split if train_split is not None else tiny_split(),
                         eval_split=eval_split, evaluator=TaskEvaluator(TASK),
                         teacher=TeacherRuntime(), accelerator=Accelerator(), seed=3,
                         checkpoint=checkpoint, log=log)
    # .cpu(): on a GPU the engine moved the student there
    return TinyRun(before, [p.detach().cpu() for p in student.parameters()], result)

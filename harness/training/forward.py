"""One batch of a training stage through the teacher and the student, to its loss terms:
the teacher's outputs (cached logits, a live teacher or its disk cache), the student's
forward as the method runs it, and the losses in float32."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn

from harness.api.method import Method, Stage, StepInputs, TeacherView
from harness.common.devices import batch_to_device
from harness.data.features import EncodedSplit
from harness.data.tasks import TaskSpec
from harness.training.autocast import autocast, step_losses

FillTeacher = Callable[[dict[str, torch.Tensor], TeacherView], None]


class TeacherSource(Protocol):
    """Where a stage's teacher outputs come from: cached training-set logits, and whatever a
    live teacher or a disk cache of its intermediate outputs gives (see
    :class:`harness.teacher.outputs.TeacherRuntime`, the implementation the runner passes)."""

    train_logits: np.ndarray | None

    def open_stage(self, method: Method, stage: Stage, student: nn.Module,
                   train_split: EncodedSplit, accelerator: Accelerator, stack: ExitStack,
                   live_logits: bool) -> FillTeacher | None:
        """Prepare the stage's teacher outputs (contexts it needs enter ``stack``, which
        stays open for the stage) and return what fills a batch's view, or None when the
        stage needs nothing beyond the cached logits."""
        ...


class _DataParallelStudent:
    """The student as a method sees it under data parallelism: attributes are the model's
    own (config, embeddings, modules), calls go through the wrapper that synchronises
    gradients, so plugins never unwrap anything."""

    def __init__(self, wrapped: nn.Module, model: nn.Module) -> None:
        object.__setattr__(self, "_wrapped", wrapped)
        object.__setattr__(self, "_model", model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapped(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def method_view(student: nn.Module, model: nn.Module) -> Any:
    """``student`` (as prepared for training, ``model`` once unwrapped) as methods receive
    it (:meth:`harness.api.method.Method.forward_student`): the model itself, or a view of
    it that calls through its data-parallel wrapper."""
    return model if model is student else _DataParallelStudent(student, model)


@dataclass(frozen=True, kw_only=True, eq=False)
class StepForward:
    """A batch's loss terms and their weighted total, its forward passes under the
    stage's autocast (``precision``)."""

    method: Method
    stage: Stage
    task: TaskSpec
    extra: nn.Module
    accelerator: Accelerator
    precision: str
    student_view: Any
    teacher_logits: torch.Tensor | None
    fill_teacher: FillTeacher | None

    @classmethod
    def open(cls, *, method: Method, stage: Stage, task: TaskSpec, student: nn.Module,
             extra: nn.Module, teacher: TeacherSource, train_split: EncodedSplit,
             accelerator: Accelerator, precision: str, stack: ExitStack) -> StepForward:
        """The steps of ``stage`` for ``student`` (as prepared for training), its teacher's
        outputs opened for the stage: contexts they need (e.g. the teacher's
        attention-score capture) enter ``stack``, which the caller closes at the stage's
        end, before any dev evaluation's preparation can leak into the timing."""
        teacher_logits = (torch.tensor(np.asarray(teacher.train_logits), dtype=torch.float32)
                          if teacher.train_logits is not None else None)
        live_logits = "logits" in stage.teacher_outputs and teacher_logits is None
        model = accelerator.unwrap_model(student)
        fill_teacher = teacher.open_stage(method, stage, model, train_split, accelerator,
                                          stack, live_logits)
        return cls(method=method, stage=stage, task=task, extra=extra,
                   accelerator=accelerator, precision=precision,
                   student_view=method_view(student, model), teacher_logits=teacher_logits,
                   fill_teacher=fill_teacher)

    def student(self, batch: dict[str, torch.Tensor]) -> Any:
        """The student's outputs on ``batch``, as the method runs its forward."""
        return self.method.forward_student(self.student_view, batch, self.stage)

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The loss terms of ``batch`` (collated, on the CPU; ``generator``: the stage's
        batch generator the method's ``prepare_batch`` draws from) and their total."""
        device = self.accelerator.device
        batch = batch_to_device(batch, device)
        batch = self.method.prepare_batch(batch, self.stage, generator)
        with autocast(self.accelerator, self.precision):
            view = TeacherView()
            if self.teacher_logits is not None:
                view.logits = self.teacher_logits[batch["row"].cpu()].to(device)
            if self.fill_teacher is not None:
                self.fill_teacher(batch, view)
            student_out = self.student(batch)
        inputs = StepInputs(batch=batch, student=student_out, teacher=view, task=self.task,
                            stage=self.stage, extra=self.extra)
        values = step_losses(self.method, inputs, self.accelerator, self.precision)
        return values, self.method.total_loss(values, self.stage)

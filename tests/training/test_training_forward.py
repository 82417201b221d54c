"""A batch through the teacher and the student to its losses
(:class:`harness.training.forward.StepForward`), on a tiny real BERT classifier: the
cached teacher logits of the batch's own rows, the method's ``prepare_batch`` drawing
from the stage's generator, the student's forward under the stage's autocast and its
losses in float32."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from harness.api.method import LossTerm, Method, MethodParams, Stage, StepInputs
from harness.data.features import PaddingCollator
from harness.teacher.outputs import TeacherRuntime
from harness.training.forward import StepForward
from tests.teacher.test_engine_teacher_outputs import TASK, tiny_classifier, tiny_split


class Recorder(Method):
    """Two loss terms on the student's logits and the teacher's; records what it saw."""

    name = "recorder"
    loss_terms = (LossTerm("match", "student vs teacher logits"),
                  LossTerm("size", "student logits squared"))

    def __init__(self) -> None:
        super().__init__(MethodParams(), {"match": 1.0, "size": 0.5})
        self.stage = Stage("task", ("match", "size"), evaluate=False)
        self.seen: list[StepInputs] = []
        self.drawn: list[float] = []

    def stages(self, task) -> list[Stage]:
        return [self.stage]

    def prepare_batch(self, batch, stage, generator):
        self.drawn.append(float(torch.rand(1, generator=generator)))
        return batch

    def loss_match(self, inputs: StepInputs) -> torch.Tensor:
        self.seen.append(inputs)
        return (inputs.student.logits - inputs.teacher.logits).pow(2).mean()

    def loss_size(self, inputs: StepInputs) -> torch.Tensor:
        return inputs.student.logits.pow(2).mean()


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_a_batchs_losses_read_its_rows_teacher_logits(precision: str) -> None:
    method, split = Recorder(), tiny_split()
    logits = np.random.default_rng(4).normal(size=(len(split), 2)).astype(np.float32)
    student = tiny_classifier(1, seed=1)
    forward = StepForward.open(
        method=method, stage=method.stage, task=TASK, student=student,
        extra=torch.nn.ModuleDict(), teacher=TeacherRuntime(train_logits=logits),
        train_split=split, accelerator=Accelerator(cpu=True), precision=precision,
        stack=ExitStack())
    rows = [5, 2, 9]
    generator = torch.Generator().manual_seed(0)
    values, total = forward(PaddingCollator(split)(rows), generator)

    [inputs] = method.seen
    torch.testing.assert_close(inputs.teacher.logits, torch.from_numpy(logits[rows]))
    assert inputs.student.logits.dtype == torch.float32  # the losses' arithmetic
    assert inputs.batch["row"].tolist() == rows
    torch.testing.assert_close(total, values["match"] + 0.5 * values["size"])
    assert method.drawn == [float(torch.rand(1, generator=torch.Generator().manual_seed(0)))]
    with torch.no_grad():
        plain = student(input_ids=inputs.batch["input_ids"],
                        attention_mask=inputs.batch["attention_mask"],
                        token_type_ids=inputs.batch["token_type_ids"]).logits
    # the student's forward as the method runs it: bf16 under autocast, else exactly fp32
    tolerance = {"atol": 0.05, "rtol": 0.05} if precision == "bf16" else {}
    torch.testing.assert_close(values["size"].detach(), plain.pow(2).mean(), **tolerance)

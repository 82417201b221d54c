"""training.fused_optimizer: AdamW's fused implementation, validated, part of a run id only
when on, and training the weights the default implementation trains, to float noise."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from harness.api.context import StudentContext
from harness.api.registry import instantiate
from harness.api.suites import load_suite
from harness.config.schema import ConfigError, StudentConfig, TrainConfig
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task
from harness.teacher.outputs import TeacherRuntime
from harness.training.engine import _optimizer, train_stage
from tests.test_intermediate_cache import teacher_config, tiny_split

TASK = get_task("rte")


def trained_weights(fused: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A tiny student's weights before and after four steps of finetune."""
    method = instantiate("finetune")
    shape = StudentConfig(num_layers=1, hidden_size=16, num_heads=4, intermediate_size=32)
    context = StudentContext(task=TASK, shape_name="tiny", shape=shape,
                             teacher_config=teacher_config())
    torch.manual_seed(1)
    student = method.build_student(context)
    before = [p.detach().clone() for p in student.parameters()]
    config = TrainConfig(epochs=1, max_steps=4, batch_size=10, lr=1e-3, warmup_ratio=0.0,
                         fused_optimizer=fused)
    train_stage(method=method, stage=method.stages(TASK)[0], student=student,
                extra=method.extra_modules(context), config=config, train_split=tiny_split(40),
                eval_split=None, evaluator=TaskEvaluator(TASK), teacher=TeacherRuntime(),
                accelerator=Accelerator(), seed=3, log=lambda line: None)
    return before, [p.detach().cpu() for p in student.parameters()]


def test_the_option_is_validated_with_its_path(tiny_suite_file):
    with pytest.raises(ConfigError, match=r"training\.fused_optimizer: .*valid boolean"):
        load_suite(str(tiny_suite_file), ["training.fused_optimizer=maybe"])
    suite = load_suite(str(tiny_suite_file), ["training.fused_optimizer=true"])
    assert suite.training.fused_optimizer is True


def test_it_enters_a_training_identity_only_when_on():
    assert "fused_optimizer" not in TrainConfig().identity()
    assert TrainConfig(fused_optimizer=True).identity()["fused_optimizer"] is True


def test_the_engine_builds_the_implementation_asked_for():
    layer = torch.nn.Linear(4, 4)
    assert _optimizer([layer], TrainConfig(fused_optimizer=True)).defaults["fused"] is True
    assert not _optimizer([layer], TrainConfig()).defaults["fused"]


def test_fused_steps_train_the_weights_the_default_steps_do():
    start, default = trained_weights(fused=False)
    fused_start, fused = trained_weights(fused=True)
    assert all(torch.equal(a, b) for a, b in zip(start, fused_start, strict=True))
    moved = sum(int((after != before).sum()) for before, after in zip(start, default,
                                                                     strict=True))
    assert moved > 1000
    for ours, theirs in zip(fused, default, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

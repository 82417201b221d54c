"""The engine's autocast settings: an fp16 step computes the gradients an fp32 step does
(the loss is scaled, so small gradients do not round to zero), and a setting autocast does
not know (an unresolved ``auto``) is refused instead of running in fp16."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from harness.api.registry import instantiate
from harness.config.schema import TrainConfig
from harness.training.engine import autocast
from tests.tiny_training import train_tiny_student

LR = 1e-3


def one_step(precision: str) -> list[torch.Tensor]:
    """The student's weight changes after one step on a small loss (as late in training)."""
    method = instantiate("finetune")
    total_loss = method.total_loss
    method.total_loss = lambda values, stage: total_loss(values, stage) * 1e-3
    config = TrainConfig(epochs=1, max_steps=1, batch_size=20, lr=LR, weight_decay=0.0,
                         warmup_ratio=0.0, max_grad_norm=1.0, mixed_precision=precision)
    return train_tiny_student(method, config).changes()


@pytest.mark.slow
def test_an_fp16_step_updates_the_weights_an_fp32_step_does():
    """Adam's first update is about lr times the gradient's sign: a gradient that fp16
    rounded to zero leaves its weight exactly where it was.  Unscaled, 27% of the weights
    an fp32 step moves stayed put here.  The test counts those, not every difference: fp16
    arithmetic can flip the sign of a gradient near zero, and on a GPU it does so for many
    weights whatever the loss scale."""
    exact = torch.cat([change.flatten() for change in one_step("no")])
    half = torch.cat([change.flatten() for change in one_step("fp16")])
    moved = exact.abs() > LR / 2
    assert moved.sum() > 500
    stayed = half[moved] == 0
    assert stayed.float().mean() < 0.01


@pytest.mark.parametrize("precision", ["auto", "fp32", "bf"])
def test_autocast_refuses_what_it_does_not_know(precision: str):
    with pytest.raises(ValueError, match="autocast precision"):
        autocast(Accelerator(), precision)


@pytest.mark.parametrize(("precision", "dtype"), [("no", torch.float32),
                                                   ("bf16", torch.bfloat16),
                                                   ("fp16", torch.float16)])
def test_autocast_settings(precision: str, dtype: torch.dtype):
    accelerator = Accelerator()
    device = accelerator.device  # autocast acts on its device's operations only
    with autocast(accelerator, precision):
        assert torch.nn.Linear(4, 4, device=device)(torch.ones(1, 4, device=device)).dtype \
            == dtype

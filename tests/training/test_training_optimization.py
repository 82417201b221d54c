"""The optimiser side of a stage (:class:`harness.training.optimization.Updates`): the
backward of a group of batches is the gradient of their mean, a step is AdamW's with
gradient clipping on the warm-up schedule, and a restored state steps on identically."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from transformers import get_linear_schedule_with_warmup

from harness.config.schema import TrainConfig
from harness.training.optimization import Updates, parameter_groups

CONFIG = TrainConfig(lr=1e-2, weight_decay=0.1, warmup_ratio=0.5, max_grad_norm=0.05)


def modules(seed: int = 0) -> tuple[nn.Module, nn.ModuleDict]:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)), nn.ModuleDict(
        {"projection": nn.Linear(2, 3)})


def loss_of(student: nn.Module, extra: nn.ModuleDict, rows: torch.Tensor) -> torch.Tensor:
    return extra["projection"](student(rows)).pow(2).mean()


def batches(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(5, 4, generator=generator) for _ in range(count)]


def test_a_group_backward_is_the_gradient_of_the_batches_mean() -> None:
    student, extra = modules()
    reference, reference_extra = copy.deepcopy(student), copy.deepcopy(extra)
    student, updates = Updates.prepare(student, extra, CONFIG, Accelerator(cpu=True), 4)
    first, second = batches(2)
    for rows in (first, second):
        updates.backward(loss_of(student, extra, rows), group_size=2)
    ((loss_of(reference, reference_extra, first) + loss_of(reference, reference_extra, second))
     / 2).backward()
    for mine, theirs in zip([*student.parameters(), *extra.parameters()],
                            [*reference.parameters(), *reference_extra.parameters()],
                            strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad)


def test_steps_are_adamws_with_clipping_on_the_warm_up_schedule() -> None:
    student, extra = modules()
    reference = [copy.deepcopy(student), copy.deepcopy(extra)]
    student, updates = Updates.prepare(student, extra, CONFIG, Accelerator(cpu=True), 4)
    optimizer = torch.optim.AdamW(parameter_groups(reference, CONFIG.weight_decay), lr=CONFIG.lr)
    schedule = get_linear_schedule_with_warmup(optimizer, 2, 4)
    assert updates.lr == 0.0  # the first step of a warm-up over two
    for rows in batches(3):
        updates.backward(loss_of(student, extra, rows), group_size=1)
        updates.step()
        loss_of(*reference, rows).backward()
        torch.nn.utils.clip_grad_norm_([p for m in reference for p in m.parameters()],
                                       CONFIG.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        assert updates.lr == pytest.approx(schedule.get_last_lr()[0])
    assert all(p.grad is None for p in student.parameters())
    for mine, theirs in zip([*student.parameters(), *extra.parameters()],
                            [p for m in reference for p in m.parameters()], strict=True):
        torch.testing.assert_close(mine, theirs)
    assert updates.lr == pytest.approx(CONFIG.lr * 0.5)  # decaying: step 3 of 4


def test_restored_updates_step_on_as_the_saved_ones_would() -> None:
    def stepped(updates: Updates, student: nn.Module, extra: nn.ModuleDict,
                rows: torch.Tensor) -> None:
        updates.backward(loss_of(student, extra, rows), group_size=1)
        updates.step()

    first, second = batches(2)
    student, extra = modules()
    student, updates = Updates.prepare(student, extra, CONFIG, Accelerator(cpu=True), 4)
    stepped(updates, student, extra, first)
    saved = copy.deepcopy({"weights": [student.state_dict(), extra.state_dict()],
                           **updates.state()})
    stepped(updates, student, extra, second)

    again, again_extra = modules(seed=5)  # other weights, replaced by the saved ones
    again, restored = Updates.prepare(again, again_extra, CONFIG, Accelerator(cpu=True), 4)
    again.load_state_dict(saved["weights"][0])
    again_extra.load_state_dict(saved["weights"][1])
    restored.restore(saved)
    assert restored.lr == pytest.approx(CONFIG.lr * 0.5)  # one step into a warm-up of two
    stepped(restored, again, again_extra, second)
    for mine, theirs in zip(again.parameters(), student.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)

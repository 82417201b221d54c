"""The loss history (:class:`harness.training.loss_log.LossLog`): window means written
every ``log_every_steps`` steps and at the last, the last entry's terms as the result's
``final_losses``, and a window that survives a save and a resume."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from harness.training.loss_log import LossLog
from harness.training.results import StageResult


def add(log: LossLog, gold: float, soft: float) -> None:
    values = {"gold": torch.tensor(gold), "soft": torch.tensor(soft)}
    log.add(values, values["gold"] + 2 * values["soft"])


def test_entries_are_the_windows_means_and_the_window_empties() -> None:
    entries: list[dict[str, float]] = []
    log = LossLog(every_steps=2, total_steps=3, accelerator=Accelerator(cpu=True),
                  on_log=entries.append)
    result = StageResult(name="task")
    assert [log.due(step) for step in (1, 2, 3)] == [False, True, True]
    add(log, 1.0, 0.5)
    add(log, 3.0, 1.5)
    means = log.write(result, step=2, epoch=0.5, lr=1e-3)
    assert means == pytest.approx({"gold": 2.0, "soft": 1.0, "loss": 4.0})
    assert result.history == entries == [
        {"step": 2, "epoch": 0.5, "lr": 1e-3, "gold": 2.0, "soft": 1.0, "loss": 4.0}]
    assert result.final_losses == {"gold": 2.0, "soft": 1.0, "total": 4.0}
    add(log, 5.0, 0.0)  # the next window holds only what came after the entry
    log.write(result, step=3, epoch=0.75, lr=5e-4)
    assert result.history[-1]["gold"] == 5.0 and result.final_losses["total"] == 5.0


def test_a_saved_window_goes_on_where_it_was() -> None:
    log = LossLog(every_steps=4, total_steps=8, accelerator=Accelerator(cpu=True))
    add(log, 1.0, 1.0)
    resumed = LossLog(every_steps=4, total_steps=8, accelerator=Accelerator(cpu=True))
    resumed.restore({name: [value.clone() for value in values]
                     for name, values in log.state().items()})
    add(resumed, 3.0, 1.0)
    result = StageResult(name="task")
    assert resumed.write(result, step=4, epoch=1.0, lr=0.0)["gold"] == 2.0

"""The loss history of a training stage: each step's loss terms gathered over a window of
``log_every_steps`` steps, their means logged (averaged over the processes) at the end of
each window and at the stage's last step."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from accelerate import Accelerator

from harness.training.distributed import mean_over_processes
from harness.training.results import StageResult


class LossLog:
    """The window of losses since the last entry, and the entries written to a result's
    ``history`` (and ``final_losses``: the last entry's terms, ``total`` the weighted sum).

    ``on_log`` sees each entry as it is added: step, epoch, lr, each loss term and
    ``loss``, the weighted total."""

    def __init__(self, every_steps: int, total_steps: int, accelerator: Accelerator,
                 on_log: Callable[[dict[str, float]], None] | None = None) -> None:
        self.every_steps = every_steps
        self.total_steps = total_steps
        self.accelerator = accelerator
        self.on_log = on_log
        self.window: defaultdict[str, list[torch.Tensor]] = defaultdict(list)

    def add(self, values: dict[str, torch.Tensor], loss: torch.Tensor) -> None:
        """One batch's loss terms and their weighted total (``loss``)."""
        for name, value in values.items():
            self.window[name].append(value.detach())
        self.window["loss"].append(loss.detach())

    def due(self, step: int) -> bool:
        """Whether an entry is written after ``step``."""
        return step % self.every_steps == 0 or step == self.total_steps

    def write(self, result: StageResult, step: int, epoch: float, lr: float) -> dict[str, float]:
        """Append the window's means to ``result.history`` (set its ``final_losses``),
        empty the window, and return the means."""
        means = {name: torch.stack(values).float().mean().item()
                 for name, values in self.window.items()}
        means = mean_over_processes(means, self.accelerator)
        result.history.append({"step": step, "epoch": epoch, "lr": lr, **means})
        result.final_losses = {k: v for k, v in means.items() if k != "loss"}
        result.final_losses["total"] = means["loss"]
        if self.on_log is not None:
            self.on_log(result.history[-1])
        self.window.clear()
        return means

    def state(self) -> dict[str, list[torch.Tensor]]:
        """The window, as progress saves it."""
        return dict(self.window)

    def restore(self, window: dict[str, list[torch.Tensor]]) -> None:
        """Continue the window :meth:`state` gave (its tensors on the accelerator's device)."""
        self.window = defaultdict(list, {
            name: [value.to(self.accelerator.device) for value in values]
            for name, values in window.items()})

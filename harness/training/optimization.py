"""The optimiser side of a training stage: AdamW over the student and the method's extra
modules, the linear warm-up and decay, the fp16 loss scaler, gradient clipping, and the
extra modules' gradients averaged over the processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from transformers import get_linear_schedule_with_warmup

from harness.config.schema import TrainConfig
from harness.training.autocast import grad_scaler
from harness.training.distributed import average_gradients


def parameter_groups(modules: Sequence[nn.Module], weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices, none on biases, LayerNorm and vectors."""
    decay, no_decay = [], []
    for module in modules:
        for name, parameter in module.named_parameters():
            if not parameter.requires_grad:
                continue
            if parameter.ndim < 2 or "LayerNorm" in name or name.endswith(".bias"):
                no_decay.append(parameter)
            else:
                decay.append(parameter)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(modules: list[nn.Module], config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over ``modules`` with ``config``'s learning rate and weight decay."""
    # fused=None (not False) leaves torch its default: a loop over the parameters on a CPU,
    # for-each kernels on a GPU.
    return torch.optim.AdamW(parameter_groups(modules, config.weight_decay), lr=config.lr,
                             fused=config.fused_optimizer or None)


@dataclass(frozen=True, eq=False)
class Updates:
    """The backward of each batch and the optimiser step of each group of batches."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    accelerator: Accelerator
    max_grad_norm: float | None
    extra_parameters: list[nn.Parameter]

    @classmethod
    def prepare(cls, student: nn.Module, extra: nn.Module, config: TrainConfig,
                accelerator: Accelerator, total_steps: int) -> tuple[nn.Module, Updates]:
        """``student`` prepared by the accelerator (wrapped for data parallelism where it
        runs) and the updates of a stage of ``total_steps`` steps.

        The scheduler is not prepared: accelerate would step it once per process per step,
        for per-process batches; here a step is one global batch on any number of
        processes.  The extra modules (projections) are not wrapped in DDP: methods call
        them directly, never through a wrapper's forward, so DDP would not reduce their
        gradients; they start from the main process's weights, as DDP's modules do, and
        their gradients are averaged before each step."""
        optimizer = build_optimizer([student, extra], config)
        scheduler = get_linear_schedule_with_warmup(
            optimizer, int(config.warmup_ratio * total_steps), total_steps)
        student, optimizer = accelerator.prepare(student, optimizer)
        scaler = grad_scaler(accelerator, config.mixed_precision)
        extra.to(accelerator.device)
        extra_parameters = [p for p in extra.parameters() if p.requires_grad]
        if accelerator.num_processes > 1:
            for tensor in [*extra.parameters(), *extra.buffers()]:
                torch.distributed.broadcast(tensor.data, src=0)
        return student, cls(optimizer, scheduler, scaler, accelerator, config.max_grad_norm,
                            extra_parameters)

    def backward(self, loss: torch.Tensor, group_size: int) -> None:
        """Backward of ``loss`` as one of ``group_size`` batches averaged into a step."""
        scaled = loss / group_size
        self.accelerator.backward(scaled if self.scaler is None else self.scaler.scale(scaled))

    def step(self) -> None:
        """Step the optimiser and the schedule on the gradients accumulated so far."""
        if self.accelerator.num_processes > 1 and self.extra_parameters:
            average_gradients(self.extra_parameters, self.accelerator)
        if self.scaler is not None:  # clipping reads the true gradients
            self.scaler.unscale_(self.optimizer)
        if self.max_grad_norm is not None:
            self.accelerator.clip_grad_norm_(
                [p for group in self.optimizer.param_groups for p in group["params"]],
                self.max_grad_norm)
        if self.scaler is None:
            self.optimizer.step()
        else:  # skipped where the gradients overflowed; the schedule goes on
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return self.scheduler.get_last_lr()[0]

    def state(self) -> dict[str, Any]:
        """The optimiser's, the schedule's and the scaler's states, as progress saves them."""
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from the states :meth:`state` gave."""
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if self.scaler is not None and saved.get("scaler") is not None:
            self.scaler.load_state_dict(saved["scaler"])

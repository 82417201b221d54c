"""Precision of a training stage: the autocast its forward passes run under, the loss
scaler fp16 needs, and the float32 arithmetic of its loss terms."""

from __future__ import annotations

import dataclasses
import functools

import torch
from accelerate import Accelerator

from harness.api.method import Method, StepInputs
from harness.common.precision import to_float32

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast settings :func:`autocast` takes (``auto`` is resolved before, see
:mod:`harness.common.precision`)."""


def autocast(accelerator: Accelerator, precision: str) -> torch.autocast:
    """Autocast to ``precision`` (``no``, ``bf16`` or ``fp16``) on the accelerator's device.

    Any other value is refused: an unresolved ``auto`` (or an inference precision such as
    ``fp32``) would otherwise have run in fp16."""
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast precision {precision!r}: expected one of "
                         f"{sorted(AUTOCAST_DTYPES)} (resolve 'auto' first)")
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return torch.autocast(accelerator.device.type, enabled=False)
    return torch.autocast(accelerator.device.type, dtype=dtype)


def grad_scaler(accelerator: Accelerator, precision: str) -> torch.amp.GradScaler | None:
    """The loss scaler fp16 training needs (None in any other precision).

    fp16's smallest normal value is about 6e-5: unscaled, the small gradients of an fp16
    backward round to zero.  The loss is scaled up before the backward, the gradients are
    unscaled before clipping, and a step whose gradients overflowed is skipped while the
    scale backs off (as ``torch.amp`` prescribes and the Hugging Face Trainer does).  bf16
    has fp32's range and needs none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(accelerator.device.type)


def step_losses(method: Method, inputs: StepInputs, accelerator: Accelerator,
                precision: str) -> dict[str, torch.Tensor]:
    """The stage's loss terms for one batch whose forward passes ran under ``precision``'s
    autocast: computed outside it, on float32 copies of the student's outputs and the
    teacher's view, except the terms that declare ``autocast`` (:class:`~harness.api.
    LossTerm`), which run under it again."""
    inputs = dataclasses.replace(
        inputs, student=to_float32(inputs.student), teacher=to_float32(inputs.teacher),
        stage_autocast=functools.partial(autocast, accelerator, precision))
    return method.compute_losses(inputs)

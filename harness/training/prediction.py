"""Logits of a model for every row of a split, in row order, on one process or split
over the processes of a distributed run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn

from harness.common.devices import batch_to_device
from harness.common.interrupts import raise_if_interrupted
from harness.common.progress import progress_bar
from harness.data.features import BucketBatchSampler, EncodedSplit
from harness.training.autocast import autocast
from harness.training.batches import batch_loader


@torch.inference_mode()
def predict_logits(model: nn.Module, split: EncodedSplit, accelerator: Accelerator,
                   batch_size: int, precision: str = "no",
                   forward: Callable[[dict[str, torch.Tensor]], Any] | None = None,
                   progress: str | None = None, distributed: bool = True) -> np.ndarray:
    """Logits for every row of ``split``, in row order (``progress``: show a bar with this
    description, for long labelling passes).

    With several processes each computes its slice of every batch and all of them get
    every row back (a collective: every process must call it alike); ``distributed=False``
    runs the whole split in this process alone (e.g. timing)."""
    forward = forward or (lambda batch: model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"]))
    distributed = distributed and accelerator.num_processes > 1
    was_training = model.training
    model.eval()
    loader = batch_loader(split, BucketBatchSampler(split.lengths, batch_size, shuffle=False),
                          accelerator, shard=distributed)
    ordered: torch.Tensor | None = None
    seen = torch.zeros(len(split), dtype=torch.bool)
    bar = progress_bar(total=len(loader), desc=progress, unit="batch", leave=False,
                       disable=progress is None or not accelerator.is_local_main_process)
    for batch, rows, own in loader:
        raise_if_interrupted()
        bar.update(1)
        batch = batch_to_device(batch, accelerator.device)
        with autocast(accelerator, precision):
            logits = forward(batch).logits.float()
        indices = batch["row"]
        if distributed:
            indices, logits = _gathered(indices, logits, rows, own, accelerator)
        indices, logits = indices.cpu(), logits.cpu()
        keep = indices >= 0
        if ordered is None:
            ordered = torch.empty((len(split), logits.shape[-1]), dtype=torch.float32)
        ordered[indices[keep]] = logits[keep]
        seen[indices[keep]] = True
    bar.close()
    model.train(was_training)
    if ordered is None or not bool(seen.all()):
        raise RuntimeError(f"predictions on {split.name}: {int((~seen).sum())} of "
                           f"{len(split)} rows missing")
    return ordered.numpy()


def _gathered(indices: torch.Tensor, logits: torch.Tensor, rows: int, own: int,
              accelerator: Accelerator) -> tuple[torch.Tensor, torch.Tensor]:
    """Every process's rows of a batch and their logits (a collective).  Equal shapes on
    every process for the gather: each pads its slice with row -1 (a repeated row standing
    in for an empty slice is dropped too)."""
    size = -(-rows // accelerator.num_processes)
    padded_rows = torch.full((size,), -1, dtype=torch.long, device=logits.device)
    padded_rows[:own] = indices[:own]
    padded = logits.new_zeros((size, logits.shape[-1]))
    padded[:own] = logits[:own]
    return accelerator.gather((padded_rows, padded))

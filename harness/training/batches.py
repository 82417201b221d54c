"""A stage's batches: the global batches every process walks, each process's share of
them, and the stage's length in optimiser steps."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from harness.config.schema import TrainConfig
from harness.data.features import (
    BucketBatchSampler,
    EncodedSplit,
    PaddingCollator,
    padding_multiple,
)
from harness.training.distributed import local_rows


def batch_loader(split: EncodedSplit, sampler: BucketBatchSampler, accelerator: Accelerator,
                 pad_token_id: int = 0, shard: bool = True) -> DataLoader:
    """This process's share of every batch of ``sampler`` (all of it with ``shard=False``
    or in one process), with the batch's global size and how many of the rows are the
    process's own: ``(batch, size, own)``.  A DataLoader on purpose: starting one draws
    its base seed from the global RNG, and the dropout masks drawn after it depend on that
    draw, so the random stream of a run (and its recorded scores) stays reproducible."""
    collate = PaddingCollator(split, pad_token_id, multiple_of=padding_multiple(accelerator.device))

    def share(rows: list[int]) -> tuple[dict[str, torch.Tensor], int, int]:
        part, own = local_rows(rows, accelerator) if shard else (list(rows), len(rows))
        return collate(part), len(rows), own

    return DataLoader(range(len(split)), batch_sampler=sampler, collate_fn=share)


@dataclass(frozen=True)
class StageBatches:
    """The shuffled, length-bucketed batches of a training stage and how they group into
    optimiser steps: every ``grad_accum_steps`` batches, and an epoch's last group even
    when it is short, so that accumulation never carries over an epoch's end."""

    sampler: BucketBatchSampler
    loader: DataLoader
    grad_accum_steps: int
    total_steps: int

    @classmethod
    def plan(cls, config: TrainConfig, split: EncodedSplit, accelerator: Accelerator,
             seed: int, pad_token_id: int = 0, rows_per_epoch: int | None = None
             ) -> StageBatches:
        """The batches of ``config`` over ``split`` (an epoch of ``rows_per_epoch`` rows;
        None: the split's); the stage ends after ``epochs`` epochs or ``max_steps``."""
        # Global batches: every process walks the same ones and trains on its slice of each.
        sampler = BucketBatchSampler(split.lengths, config.batch_size, shuffle=True,
                                     seed=seed, rows_per_epoch=rows_per_epoch)
        loader = batch_loader(split, sampler, accelerator, pad_token_id)
        steps_per_epoch = math.ceil(len(loader) / config.grad_accum_steps)
        total_steps = math.ceil(config.epochs * steps_per_epoch)
        if config.max_steps is not None:
            total_steps = min(total_steps, config.max_steps)
        return cls(sampler, loader, config.grad_accum_steps, total_steps)

    @property
    def per_epoch(self) -> int:
        """Batches in an epoch."""
        return len(self.loader)

    @property
    def steps_per_epoch(self) -> int:
        """Optimiser steps in an epoch."""
        return math.ceil(self.per_epoch / self.grad_accum_steps)

    def group_size(self, index: int) -> int:
        """How many batches the optimiser step of batch ``index`` (of its epoch) averages."""
        start = index - index % self.grad_accum_steps
        return min(self.grad_accum_steps, self.per_epoch - start)

    def ends_group(self, index: int) -> bool:
        """Whether the optimiser steps after batch ``index`` of its epoch."""
        return (index + 1) % self.grad_accum_steps == 0 or index + 1 >= self.per_epoch

    def epochs_done(self, epoch: int, index: int) -> float:
        """Epochs trained once batch ``index`` of epoch ``epoch`` is."""
        return epoch + (index + 1) / self.per_epoch

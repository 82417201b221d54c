"""A stage's batches (:class:`harness.training.batches.StageBatches`): how many steps a
configuration makes, which batches each optimiser step averages, and the epochs trained,
on a real split of random rows."""

from __future__ import annotations

import pytest
from accelerate import Accelerator

from harness.config.schema import TrainConfig
from harness.training.batches import StageBatches
from tests.teacher.test_intermediate_cache import tiny_split


def plan(rows: int = 20, rows_per_epoch: int | None = None, **config) -> StageBatches:
    return StageBatches.plan(TrainConfig(**config), tiny_split(rows), Accelerator(cpu=True),
                             seed=3, rows_per_epoch=rows_per_epoch)


def test_groups_of_accumulated_batches_end_with_the_epoch() -> None:
    batches = plan(batch_size=6, grad_accum_steps=3, epochs=2)  # 4 batches: a group of 3, one of 1
    assert (batches.per_epoch, batches.steps_per_epoch, batches.total_steps) == (4, 2, 4)
    assert [batches.group_size(index) for index in range(4)] == [3, 3, 3, 1]
    assert [batches.ends_group(index) for index in range(4)] == [False, False, True, True]
    assert batches.epochs_done(1, 2) == pytest.approx(1.75)


@pytest.mark.parametrize("config, rows_per_epoch, total", [
    ({"batch_size": 5, "epochs": 1.5}, None, 6),         # 4 steps an epoch, half of one more
    ({"batch_size": 5, "epochs": 3, "max_steps": 5}, None, 5),
    ({"batch_size": 5, "epochs": 1}, 12, 3),             # an epoch of the task's 12 rows
])
def test_the_stage_length(config: dict, rows_per_epoch: int | None, total: int) -> None:
    assert plan(rows_per_epoch=rows_per_epoch, **config).total_steps == total


def test_the_loader_yields_every_row_once_an_epoch_with_its_sizes() -> None:
    batches = plan(batch_size=6)
    batches.sampler.set_epoch(0)
    seen = []
    for batch, rows, own in batches.loader:
        assert rows == own == len(batch["row"]) and batch["input_ids"].shape[0] == rows
        seen += batch["row"].tolist()
    assert sorted(seen) == list(range(20))

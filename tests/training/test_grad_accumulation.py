"""Gradient accumulation keeps a stage's epochs: an epoch's short last group of batches
steps the optimiser, so a stage of E epochs trains on E epochs of rows and evaluates at
each epoch's end, whatever the number of batches per group."""

from __future__ import annotations

import pytest

from harness.api.registry import instantiate
from harness.config.schema import TrainConfig
from tests.teacher.test_intermediate_cache import tiny_split
from tests.tiny_training import train_tiny_student


def train(grad_accum_steps: int):
    split = tiny_split(20)  # 4 batches of 5 an epoch
    config = TrainConfig(epochs=3, batch_size=5, lr=1e-3, log_every_steps=1,
                         grad_accum_steps=grad_accum_steps)
    return train_tiny_student(instantiate("finetune"), config, train_split=split,
                              eval_split=split).result


@pytest.mark.slow
@pytest.mark.parametrize(("grad_accum_steps", "steps_per_epoch"), [(1, 4), (2, 2), (3, 2), (4, 1)])
def test_accumulation_trains_every_epoch_and_evaluates_at_its_end(grad_accum_steps,
                                                                   steps_per_epoch):
    result = train(grad_accum_steps)
    assert result.examples_seen == 3 * 20
    assert result.steps == 3 * steps_per_epoch
    assert [e["epoch"] for e in result.evaluations] == [1, 2, 3]
    # the history's epochs are those completed when each entry is written, as there
    assert [h["epoch"] for h in result.history][steps_per_epoch - 1::steps_per_epoch] == \
        [1, 2, 3]
    assert [h["epoch"] for h in result.history] == sorted(h["epoch"] for h in result.history)
    assert [e["step"] for e in result.evaluations] == [steps_per_epoch * k for k in (1, 2, 3)]

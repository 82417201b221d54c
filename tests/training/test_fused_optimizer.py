"""training.fused_optimizer: AdamW's fused implementation, validated, part of a run id only
when on, and training the weights the default implementation trains, to float noise."""

from __future__ import annotations

import pytest
import torch

from harness.api.registry import instantiate
from harness.config.schema import ConfigError, TrainConfig
from harness.experiments.suites import load_suite
from harness.training.optimization import build_optimizer
from tests.teacher.test_intermediate_cache import tiny_split
from tests.tiny_training import TinyRun, train_tiny_student


def train(fused: bool) -> TinyRun:
    """Four steps of finetune on a tiny student; a weight decay large enough that leaving
    it out (or applying it to biases and LayerNorms) shows."""
    config = TrainConfig(epochs=1, max_steps=4, batch_size=10, lr=1e-2, weight_decay=0.5,
                         warmup_ratio=0.0, fused_optimizer=fused)
    return train_tiny_student(instantiate("finetune"), config, train_split=tiny_split(40))


def test_the_option_is_validated_with_its_path(tiny_suite_file):
    with pytest.raises(ConfigError, match=r"training\.fused_optimizer: .*valid boolean"):
        load_suite(str(tiny_suite_file), ["training.fused_optimizer=maybe"])
    suite = load_suite(str(tiny_suite_file), ["training.fused_optimizer=true"])
    assert suite.training.fused_optimizer is True


def test_it_enters_a_training_identity_only_when_on():
    assert "fused_optimizer" not in TrainConfig().identity()
    assert TrainConfig(fused_optimizer=True).identity()["fused_optimizer"] is True


def test_the_engine_builds_the_implementation_asked_for():
    layer = torch.nn.Linear(4, 4)
    assert build_optimizer([layer], TrainConfig(fused_optimizer=True)).defaults["fused"] is True
    assert not build_optimizer([layer], TrainConfig()).defaults["fused"]


@pytest.mark.slow
def test_fused_steps_train_the_weights_the_default_steps_do():
    default, fused = train(fused=False), train(fused=True)
    assert all(torch.equal(a, b) for a, b in zip(default.before, fused.before, strict=True))
    assert sum(int((change != 0).sum()) for change in default.changes()) > 1000
    for ours, theirs in zip(fused.after, default.after, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

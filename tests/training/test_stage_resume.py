"""A stage that saves its progress and is killed part-way resumes where it was and ends
exactly as if it had never stopped (tiny random BERT, dropout on, several epochs)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from harness.api.registry import instantiate
from harness.common.cache import ArtifactCache
from harness.config.schema import TrainConfig
from harness.training.engine import StageCheckpoint
from harness.training.progress_file import load_progress_file, save_progress_file
from tests.tiny_training import train_tiny_student

CONFIG = TrainConfig(epochs=3, batch_size=6, lr=1e-3, log_every_steps=1)  # 4 batches/epoch


class Stopped(Exception):
    """Stands for the process being killed."""


def run(method, checkpoint: StageCheckpoint | None = None, config: TrainConfig = CONFIG,
        log: Callable[[str], None] = lambda line: None):
    trained = train_tiny_student(method, config, layers=2, dropout_seed=2,
                                 checkpoint=checkpoint, log=log)
    return trained.result, torch.cat([p.flatten() for p in trained.after])


def stopping_after(calls: int):
    """The finetune method, killed during its ``calls``-th step."""
    plain = instantiate("finetune")

    class Stopping(type(plain)):
        seen = 0

        def compute_losses(self, inputs):
            Stopping.seen += 1
            if Stopping.seen == calls:
                raise Stopped
            return super().compute_losses(inputs)

    return Stopping(plain.params, plain.weights)


@pytest.mark.slow
@pytest.mark.parametrize("killed_at", [3, 7, 10])  # in epoch 1, epoch 2, epoch 3
def test_a_killed_stage_resumes_exactly(tmp_path: Path, killed_at: int) -> None:
    expected, weights = run(instantiate("finetune"))
    assert expected.steps == 12
    checkpoint = StageCheckpoint(tmp_path / "progress.safetensors", every_steps=2)
    with pytest.raises(Stopped):
        run(stopping_after(killed_at), checkpoint)
    assert checkpoint.path.exists()
    saved = load_progress_file(checkpoint.path)
    assert saved["step"] == (killed_at - 1) // 2 * 2  # the last save before the kill
    resumed, resumed_weights = run(instantiate("finetune"), checkpoint)
    assert torch.equal(resumed_weights, weights)
    assert resumed.steps == 12 and resumed.examples_seen == expected.examples_seen
    assert [row["loss"] for row in resumed.history] == [row["loss"] for row in expected.history]


@pytest.mark.slow
def test_saved_progress_for_another_budget_or_damaged_is_not_used(tmp_path: Path) -> None:
    weights = run(instantiate("finetune"))[1]
    checkpoint = StageCheckpoint(tmp_path / "progress.safetensors", every_steps=2)
    with pytest.raises(Stopped):
        run(stopping_after(5), checkpoint, config=CONFIG.model_copy(update={"lr": 5e-4}))
    assert torch.equal(run(instantiate("finetune"), checkpoint)[1], weights)
    checkpoint.path.write_bytes(b"not a checkpoint")
    assert torch.equal(run(instantiate("finetune"), checkpoint)[1], weights)


@pytest.mark.slow
def test_saved_progress_from_another_build_of_what_the_stage_reads_is_not_resumed(
        tmp_path: Path) -> None:
    """Saved progress records the digests of the cache entries the stage reads (a general
    stage's fitted masked-LM head, :meth:`Method.general_made_from`).  Resumed once one
    of them holds another build (fitted again elsewhere, or removed and to be made
    again), the stage would train on a mix of the two: it starts over and says why.
    Progress saved without the record is not resumed either."""
    cache = ArtifactCache(tmp_path / "cache", log=lambda line: None)

    def fit(weights: str) -> None:
        with cache.build("mlm_head", "k" * 64, {}, replace=True) as folder:
            (folder / "head.pt").write_text(weights)

    fit("first")
    checkpoint = StageCheckpoint(tmp_path / "progress.safetensors", every_steps=2, cache=cache,
                                 made_from=lambda: [("mlm_head", "k" * 64)])
    config = CONFIG.model_copy(update={"epochs": 1})  # 4 steps
    with pytest.raises(Stopped):
        run(stopping_after(3), checkpoint, config)
    saved = load_progress_file(checkpoint.path)
    assert saved["step"] == 2
    assert saved["made_from"] == {f"mlm_head/{'k' * 64}": cache.files_digest("mlm_head",
                                                                           "k" * 64)}

    def resumed() -> list[str]:
        lines: list[str] = []
        run(instantiate("finetune"), checkpoint, config, log=lines.append)
        return lines

    assert any(" resuming at step " in line for line in resumed())
    fit("second")
    assert resumed() == [f"[engine] {checkpoint.path}: it was saved from another build of "
                         f"mlm_head/{'k' * 16} (since rebuilt with other contents); "
                         "starting over"]
    shutil.rmtree(cache.path("mlm_head", "k" * 64))
    assert resumed() == [f"[engine] {checkpoint.path}: it was saved from another build of "
                         f"mlm_head/{'k' * 16} (no longer cached); starting over"]
    del saved["made_from"]
    save_progress_file(checkpoint.path, saved)
    assert resumed() == [f"[engine] {checkpoint.path}: saved progress without made_from; "
                         "starting over"]

"""A stage's saves (:class:`harness.training.stage_saves.StageSaves`): when it saves, the
state it writes and reads back, and the saved states it refuses to resume (each with
the line that says why)."""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate import Accelerator

from harness.config.schema import TrainConfig
from harness.training.stage_saves import PROGRESS_KEYS, StageCheckpoint, StageSaves

CONFIG = TrainConfig(batch_size=4)


def saves(checkpoint: StageCheckpoint | None, lines: list[str], total_steps: int = 6,
          config: TrainConfig = CONFIG) -> StageSaves:
    return StageSaves(checkpoint, config, total_steps, "task", Accelerator(cpu=True),
                      lines.append)


def state(step: int) -> dict:
    """Every key a stage saves but the three :class:`StageSaves` adds."""
    values = {key: None for key in PROGRESS_KEYS - {"config", "total_steps", "made_from"}}
    return {**values, "student": {"weight": torch.arange(6.0).reshape(2, 3)}, "step": step,
            "window": {"loss": [torch.tensor(0.5)]}, "result": {"name": "task", "steps": 0}}


def test_saves_fall_every_n_steps_and_never_after_the_last(tmp_path: Path) -> None:
    by_steps = saves(StageCheckpoint(tmp_path / "p.safetensors", every_steps=2), [])
    assert [step for step in range(1, 7) if by_steps.due(step)] == [2, 4]
    by_time = saves(StageCheckpoint(tmp_path / "p.safetensors", every_seconds=0.0), [])
    assert [step for step in range(1, 7) if by_time.due(step)] == [1, 2, 3, 4, 5]
    assert not any(saves(None, []).due(step) for step in range(1, 7))


def test_a_saved_state_is_resumed_whole(tmp_path: Path) -> None:
    lines: list[str] = []
    writer = saves(StageCheckpoint(tmp_path / "p.safetensors", every_steps=2), lines)
    assert writer.load() is None  # nothing saved yet
    writer.save(state(step=4))
    loaded = saves(StageCheckpoint(tmp_path / "p.safetensors"), lines).load()
    assert loaded is not None and loaded.keys() == PROGRESS_KEYS
    assert (loaded["step"], loaded["total_steps"]) == (4, 6)
    assert loaded["config"] == CONFIG.model_dump(mode="json")
    torch.testing.assert_close(loaded["student"]["weight"], torch.arange(6.0).reshape(2, 3))
    assert lines == []


def test_a_state_saved_for_another_budget_or_incomplete_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    lines: list[str] = []
    saves(StageCheckpoint(path), lines).save(state(step=2))
    assert saves(StageCheckpoint(path), lines, total_steps=8).load() is None
    other = TrainConfig(batch_size=8)
    assert saves(StageCheckpoint(path), lines, config=other).load() is None
    assert lines == [f"[engine] {path}: saved for another budget; starting over"] * 2
    lines.clear()
    incomplete = state(step=2)
    del incomplete["window"], incomplete["best_state"]
    saves(StageCheckpoint(path), lines).save(incomplete)
    assert saves(StageCheckpoint(path), lines).load() is None
    assert lines == [f"[engine] {path}: saved progress without best_state, window; "
                     "starting over"]


def test_an_older_pickle_beside_is_removed_unread(tmp_path: Path) -> None:
    pickled = tmp_path / "p.pt"
    pickled.write_bytes(b"\x80\x04not to be read")
    lines: list[str] = []
    assert saves(StageCheckpoint(tmp_path / "p.safetensors"), lines).load() is None
    assert not pickled.exists()
    assert lines == [f"[engine] {pickled}: saved progress in the older pickle format, which "
                     "is never loaded; removed it, starting over"]

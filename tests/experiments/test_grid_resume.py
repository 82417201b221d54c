"""Resuming a grid decides from the records what is done: a cell stopped by Ctrl-C or by an
exception (which Optuna fails and never retries) runs when the grid restarts, a cell whose
run failed (a failed record) does not unless failed runs are retried, one whose workers
kept dying is left as the heartbeat check left it, a cell queued (again) by two workers at
once runs once, and a queue its first worker did not finish filling is filled by the
next."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from harness.assets.checkpoints import TeacherError
from harness.cli import app
from harness.experiments.grid import Grid, GridCellError
from harness.experiments.runner import SuiteRunner
from harness.experiments.storage import MAX_RETRIES
from harness.experiments.store import StoreNotWritableError
from harness.experiments.suites import load_suite
from tests.conftest import optuna_warnings
from tests.experiments.test_grid import _check_every_cell_once, _records, grid_suite

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

# A weight decay that blows the weights up at the first step: every run's loss is NaN and
# the run writes a failed record.
DIVERGING = {"epochs": 1, "batch_size": 8, "lr": 1e-3, "log_every_steps": 1,
             "weight_decay": 1e30, "max_grad_norm": None, "warmup_ratio": 0.0}


def _suite(tmp_path: Path, data_dir: Path, teacher_dir: Path, seeds: list[int],
           training: dict | None = None) -> Path:
    return grid_suite(tmp_path, data_dir, teacher_dir,
                      {"methods": ["finetune"], "tasks": ["rte"], "seeds": seeds,
                       "budget": {"task_epochs": 1}},
                      training=training or {"epochs": 1, "batch_size": 8, "lr": 1e-3,
                                            "log_every_steps": 1})


def _grid(path: Path, log: Callable[[str], None] = lambda _: None) -> Grid:
    results = path.parent / "results"
    results.mkdir(exist_ok=True)
    return Grid(load_suite(str(path)), results, f"sqlite:///{results / 'optuna.db'}",
                path.parent / "cache", log=log)


def _trials(grid: Grid) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=grid.study_name,
                             storage=grid.storage_url).get_trials()


def _interrupt_first_cell(grid: Grid, error: BaseException) -> None:
    """The grid's first cell stops with ``error`` before it trains (Ctrl-C, or a crash);
    the cells after it run for real."""
    run_one = grid.runner.run_one
    calls = []

    def stopped(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise error
        return run_one(*args, **kwargs)

    grid.runner.run_one = stopped


@pytest.mark.e2e
@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("a bug")],
                         ids=["ctrl-c", "bug"])
def test_a_cell_stopped_without_a_record_runs_when_the_grid_restarts(
        tmp_path, tiny_data_dir, tiny_teacher_dir, error):
    """Ctrl-C and a bug (an unexpected error, a RuntimeError too) stop the grid at once."""
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1, 2])
    first = _grid(path)
    _interrupt_first_cell(first, error)
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            first.work()
    else:
        with pytest.raises(GridCellError) as stopped:
            first.work()
        assert stopped.value.__cause__ is error and stopped.value.trial == 0
        assert [trial.state.name for trial in _trials(first)] == ["FAIL", "WAITING"]
    assert _trials(first)[0].state.name == "FAIL"
    assert first.plan()[0].status == "todo"  # the dry run says so, and the grid agrees:

    lines: list[str] = []
    second = _grid(path, log=lines.append)
    summary = second.work()
    assert summary["complete"] == summary["cells"] == 2
    assert summary["fail"] - summary["retried"] == 0  # what `harness grid` reports failed
    assert [line for line in lines if "queued again" in line] == [
        "[grid] queued again 1 cells stopped without a record: finetune / rte / seed 1"]
    _check_every_cell_once(second, path.parent / "results")
    stopped = _trials(second)[0]  # (a dead worker's trial would say nothing)
    assert stopped.user_attrs["stopped"].startswith(type(error).__name__)

    trials = len(_trials(second))
    third = _grid(path)  # every cell recorded: nothing to queue or run
    assert third.work()["complete"] == 2
    assert len(_trials(third)) == trials


@pytest.mark.e2e
@pytest.mark.parametrize("error", [RuntimeError("a bug"), TypeError("a bug"),
                                   TeacherError("the teacher scores below chance")],
                         ids=["runtime-error", "type-error", "teacher"])
def test_a_bug_stops_the_grid_with_one_traceback_a_cells_failure_does_not(
        tmp_path, tiny_data_dir, tiny_teacher_dir, monkeypatch, error):
    """An unexpected error in a cell (a RuntimeError too) stops the grid with one traceback
    (Optuna logs nothing), exit 1, the cell unrecorded.  A teacher that cannot be made
    (every cell of its task meets the same error) fails each cell in one line, and the grid
    goes on."""
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1, 2])
    results = path.parent / "results"
    results.mkdir()
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(args)
        raise error

    monkeypatch.setattr(SuiteRunner, "run_one", failing)
    with optuna_warnings() as warned:
        result = CliRunner().invoke(app, [
            "grid", "--suite", str(path), "--results", str(results), "--cache-dir",
            str(path.parent / "cache"), "--storage", f"sqlite:///{results / 'optuna.db'}"])
    assert warned == []
    assert result.exit_code == 1, result.output
    assert not _records(results)
    if isinstance(error, TeacherError):
        assert "Traceback" not in result.output
        assert len(calls) == 2  # the grid went on
        for seed, trial in ((1, 0), (2, 1)):
            assert (f"[grid] cell {trial} failed: finetune / rte / seed {seed}: teacher: the "
                    "teacher scores below chance") in result.output
        assert "0 of 2 cells complete, 2 failed" in result.output
        return
    assert result.output.count("Traceback") == 1, result.output
    assert f"{type(error).__name__}: a bug" in result.output
    assert len(calls) == 1  # the grid stopped
    assert ("error: cell finetune / rte / seed 1 (trial 0) stopped the grid" in result.output)
    assert "the same command queues it again" in result.output


@pytest.mark.e2e
def test_a_cell_whose_run_failed_runs_again_only_when_failed_runs_are_retried(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1], training=DIVERGING)
    summary = _grid(path).work()
    assert (summary["complete"], summary["fail"]) == (0, 1)
    [[record]] = _records(path.parent / "results").values()
    assert record["status"] == "failed"

    again = _grid(path)  # a failed record is the cell's result: it is not run again
    assert again.plan()[0].status == "failed"
    assert again.work()["fail"] == 1
    assert len(_trials(again)) == 1
    assert list(_records(path.parent / "results").values()) == [[record]]

    results = path.parent / "results"
    retried = CliRunner().invoke(app, [
        "grid", "--suite", str(path), "--results", str(results), "--cache-dir",
        str(path.parent / "cache"), "--storage", f"sqlite:///{results / 'optuna.db'}",
        "--retry-failed"])
    assert retried.exit_code == 1, retried.output  # it failed again
    trials = _trials(again)
    assert [trial.state.name for trial in trials] == ["FAIL", "FAIL"]
    assert trials[1].user_attrs["status"] == "failed"  # trained again, and failed again
    [[rerun]] = _records(path.parent / "results").values()
    assert rerun["status"] == "failed" and rerun["started_at"] != record["started_at"]


@pytest.mark.e2e
def test_a_cell_queued_again_by_two_workers_at_once_runs_once(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1])
    first = _grid(path)
    _interrupt_first_cell(first, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        first.work()

    # Two workers start together: each finds the cell unsettled before the other queues it.
    one, other = _grid(path), _grid(path)
    studies = one._grid_study(), other._grid_study()
    unsettled = one.unsettled(studies[0]), other.unsettled(studies[1])
    assert unsettled[0] == unsettled[1] == [(one.cells[0], 0)]
    one.enqueue_again(studies[0], unsettled[0])
    other.enqueue_again(studies[1], unsettled[1])
    assert [trial.state.name for trial in _trials(one)] == ["FAIL", "WAITING", "WAITING"]

    summary = other.work()
    assert (summary["complete"], summary["fail"] - summary["retried"]) == (1, 0)
    trials = _trials(other)
    assert [trial.state.name for trial in trials] == ["FAIL", "COMPLETE", "PRUNED"]
    assert trials[2].user_attrs["duplicate"] and "worker" not in trials[2].user_attrs
    _check_every_cell_once(other, path.parent / "results")
    [[record]] = _records(path.parent / "results").values()
    assert record["grid"] == {"study": other.study_name, "trial": 1}


@pytest.mark.slow
def test_a_queue_left_half_filled_by_a_killed_worker_is_filled_by_the_next_one(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1, 2, 3])
    first = _grid(path)
    first.enqueue_again(first._grid_study(), [(first.cells[0], None)])  # then it was killed

    lines: list[str] = []
    second = _grid(path, log=lines.append)
    summary = second.work()
    assert summary["complete"] == summary["cells"] == 3
    assert "[grid] queued 2 cells no worker had queued yet" in lines
    assert not [line for line in lines if "queued again" in line]
    assert [trial.state.name for trial in _trials(second)] == ["COMPLETE"] * 3
    _check_every_cell_once(second, path.parent / "results")


@pytest.mark.slow
def test_workers_filling_a_new_queue_at_once_run_each_cell_once(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1, 2])
    one, other = _grid(path), _grid(path)
    studies = one._grid_study(), other._grid_study()
    unsettled = one.unsettled(studies[0]), other.unsettled(studies[1])
    assert unsettled[0] == unsettled[1] == [(cell, None) for cell in one.cells]
    one.enqueue_again(studies[0], unsettled[0])
    other.enqueue_again(studies[1], unsettled[1])

    summary = other.work()
    assert (summary["complete"], summary["fail"]) == (2, 0)
    trials = _trials(other)
    assert [trial.state.name for trial in trials] == ["COMPLETE"] * 2 + ["PRUNED"] * 2
    assert all(trial.user_attrs["duplicate"] for trial in trials[2:])
    _check_every_cell_once(other, path.parent / "results")


def test_a_store_that_cannot_hold_records_stops_the_grid_at_its_first_cell(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """Not a failed cell to go on past: every cell would fail alike (and under `accelerate
    launch` every process stops together, as the check's answer is broadcast)."""
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1, 2])
    results = path.parent / "results"
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "finetune").write_text("a file where the method's folder goes\n")
    grid = _grid(path)
    with pytest.raises(StoreNotWritableError, match="cannot write records into"):
        grid.work()
    assert [trial.state.name for trial in _trials(grid)] == ["FAIL", "WAITING"]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")  # ask(), not optimize()
def test_a_cell_whose_workers_kept_dying_is_not_queued_again_by_a_starting_worker(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """The heartbeat check retries a dead worker's cell MAX_RETRIES times, then gives up
    (an out-of-memory kill would kill every worker): a starting worker does not start the
    retries over, while it queues again a cell stopped in its own process (Ctrl-C)."""
    path = _suite(tmp_path, tiny_data_dir, tiny_teacher_dir, seeds=[1])
    lines: list[str] = []
    grid = _grid(path, log=lines.append)
    study = grid._grid_study()
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # its worker died, and ...
    cell = {"cell": asdict(grid.cells[0])}
    for retry in range(1, MAX_RETRIES + 1):  # ... each retry's worker died too
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL, user_attrs=cell,
            system_attrs={"failed_trial": 0, "retry_history": list(range(retry))}))
    assert grid.unsettled(study) == []
    assert lines == [f"[grid] finetune / rte / seed 1: not queued again: its worker died "
                     f"{MAX_RETRIES + 1} times in a row (trial {MAX_RETRIES})"]

    study.add_trial(optuna.trial.create_trial(  # queued again by hand, then Ctrl-C
        state=optuna.trial.TrialState.FAIL,
        user_attrs={**cell, "stopped": "KeyboardInterrupt: "}))
    assert grid.unsettled(study) == [(grid.cells[0], MAX_RETRIES + 1)]

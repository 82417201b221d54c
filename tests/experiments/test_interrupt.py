"""What one Ctrl-C and a failing grid cell leave on the screen and in the store: one Ctrl-C
stops `harness run` and `harness grid` mid-training with status 130 and a line saying that
the same command resumes, and the stopped run has no record (that the same command then
trains it once is tested in-process by test_runner.py and test_grid_resume.py); a failing
grid cell is the harness's one line, not Optuna's traceback, while an
unexpected error keeps its traceback."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from harness.experiments.storage import open_storage
from harness.experiments.store import InvalidRecordError
from harness.experiments.tuning import TrialFailed, quiet_reported_failures
from tests.experiments.test_grid import REPO, _env, _records, default_sigint, grid_suite

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

OPTUNA_WARNING = "failed with parameters"  # the start of Optuna's warning about a failed trial


def _started(*args: str) -> subprocess.Popen:
    """`harness ARGS` in a session of its own, as a shell runs a job: a terminal's Ctrl-C
    signals the whole group, children included (see _ctrl_c)."""
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=REPO,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=default_sigint)


def _ctrl_c_once_training(job: subprocess.Popen, bar: str, timeout: float = 120) -> str:
    """Read ``job``'s output until the progress bar ``bar`` of a stage starts (training has
    begun), send SIGINT once to its process group, as one Ctrl-C in a terminal does, and
    return its whole output once it has exited (a TimeoutExpired if it has not within
    ``timeout`` seconds: one Ctrl-C did not stop it)."""
    assert job.stdout is not None
    seen = []
    for line in job.stdout:  # universal newlines: a progress bar's "\r" ends a line too
        seen.append(line)
        if bar in line:
            break
    else:
        raise AssertionError("the job ended before training started:\n" + "".join(seen))
    os.killpg(job.pid, signal.SIGINT)
    rest, _ = job.communicate(timeout=timeout)
    return "".join(seen) + rest


@pytest.fixture
def long_suite(tmp_path, tiny_data_dir, tiny_teacher_dir) -> Path:
    """kd on STS-B for seeds 1 and 2, 30 epochs each (180 steps: seconds, long enough for
    a signal sent as a stage starts to land inside it)."""
    return grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["kd"], "tasks": ["stsb"], "seeds": [1, 2]},
                      training={"epochs": 30, "batch_size": 8, "lr": 1e-3,
                                "log_every_steps": 1})


@pytest.mark.e2e
def test_one_ctrl_c_stops_run_with_one_line_and_no_record_of_the_stopped_run(tmp_path, long_suite):
    results = tmp_path / "results"
    command = ["run", "--suite", str(long_suite), "--method", "kd", "--tasks", "stsb",
               "--seeds", "1,2", "--results", str(results), "--cache-dir",
               str(tmp_path / "cache")]
    job = _started(*command)
    output = _ctrl_c_once_training(job, "kd stsb s2 task")  # seed 1 is recorded by then
    assert job.returncode == 130, output
    assert "Traceback" not in output, output
    assert ("[run] interrupted (Ctrl-C): the run in progress is not recorded; the same "
            "command skips the recorded runs and trains it again") in output
    [(seed_1,)] = _records(results).values()  # the stopped run left no record
    assert seed_1["seed"] == 1 and seed_1["status"] == "finished"
    # That the same command then trains the stopped run once: tests/experiments/test_runner.py
    # (test_run_killed_midway_resumes_without_duplicate_or_partial_records).


@pytest.mark.e2e
def test_one_ctrl_c_stops_grid_with_one_line_and_no_record_of_the_stopped_cell(
        tmp_path, long_suite):
    results = tmp_path / "results"
    command = ["grid", "--suite", str(long_suite), "--results", str(results), "--cache-dir",
               str(tmp_path / "cache")]
    job = _started(*command)
    output = _ctrl_c_once_training(job, "kd stsb s2 task")
    assert job.returncode == 130, output
    # The harness's line, not Optuna's warning with the KeyboardInterrupt's traceback.
    assert "Traceback" not in output and OPTUNA_WARNING not in output, output
    [said] = [line for line in output.splitlines() if "interrupted" in line]
    assert said.startswith("[grid] interrupted (Ctrl-C): cell kd / stsb / seed 2 (trial 1) "
                           "is not recorded; the same command queues it again"), said
    [(seed_1,)] = _records(results).values()
    assert seed_1["seed"] == 1 and seed_1["status"] == "finished"
    storage = f"sqlite:///{results / 'optuna.db'}"
    [summary] = optuna.get_all_study_summaries(open_storage(storage))
    study = optuna.load_study(study_name=summary.study_name, storage=open_storage(storage))
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "FAIL"]
    # That the next grid queues the stopped cell again and runs it once:
    # tests/experiments/test_grid_resume.py (test_a_cell_stopped_without_a_record_runs_when_...).


@pytest.mark.e2e
def test_a_failing_grid_cell_is_one_line_of_the_harness_not_optunas_traceback(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """A diverged cell printed Optuna's "Trial 0 failed ... because of the following error"
    warning with a traceback through the grid's objective on top of the runner's line."""
    suite = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                       {"methods": ["kd"], "tasks": ["stsb"], "seeds": [1]})
    results = tmp_path / "results"
    diverging = ["training.weight_decay=1.0e+30", "training.max_grad_norm=null",
                 "training.warmup_ratio=0"]
    job = subprocess.run(
        [sys.executable, "-m", "harness.cli", "grid", "--suite", str(suite), "--results",
         str(results), "--cache-dir", str(tmp_path / "cache"),
         *[arg for assignment in diverging for arg in ("--set", assignment)]],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    output = job.stdout + job.stderr
    assert job.returncode == 1, output
    assert "Traceback" not in output and OPTUNA_WARNING not in output, output
    [(record,)] = _records(results).values()
    assert record["status"] == "failed"
    [path] = results.glob("tiny/kd/stsb/*.json")
    [said] = [line for line in output.splitlines() if line.startswith("[grid] cell 0 failed")]
    assert said == (f"[grid] cell 0 failed: kd / stsb / seed 1: run failed: {record['error']}"
                    f"; recorded at {path}")
    assert "0 of 1 cells complete, 1 failed" in output
    storage = f"sqlite:///{results / 'optuna.db'}"
    [summary] = optuna.get_all_study_summaries(open_storage(storage))
    study = optuna.load_study(study_name=summary.study_name, storage=open_storage(storage))
    assert [trial.state.name for trial in study.trials] == ["FAIL"]


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_optuna_stays_quiet_about_reported_failures_only():
    """A failure the harness reports itself fails its trial without Optuna's warnings; an
    unexpected error (a bug) keeps Optuna's warning with its traceback."""
    kept = _Kept()
    logger = logging.getLogger("optuna.study._optimize")
    logger.addHandler(kept)
    study = optuna.create_study(direction="maximize")

    def reported(_trial) -> float:
        raise TrialFailed("kd / stsb / seed 1: run failed")

    def ctrl_c(_trial) -> float:
        raise KeyboardInterrupt

    def bug(_trial) -> float:
        return 1 / 0

    try:
        with quiet_reported_failures():
            study.optimize(reported, n_trials=1, catch=(RuntimeError,))
            with pytest.raises(KeyboardInterrupt):
                study.optimize(ctrl_c, n_trials=1)
            study.optimize(bug, n_trials=1, catch=(ZeroDivisionError,))
    finally:
        logger.removeHandler(kept)
    assert [trial.state.name for trial in study.trials] == ["FAIL", "FAIL", "FAIL"]
    shown = [record.getMessage() for record in kept.records]
    assert shown == ["Trial 2 failed with parameters: {} because of the following error: "
                     "ZeroDivisionError('division by zero').", "Trial 2 failed with value None."]
    assert kept.records[0].exc_info is not None  # the bug's traceback
    assert logger.filters == []  # the filter goes with the block


def test_optuna_stays_quiet_about_a_record_that_does_not_load():
    """A trial whose run finds its record in the store refused (edited after the run)
    stops the command, which prints the error naming the file in one line: Optuna's
    warning would print it again, under a traceback."""
    kept = _Kept()
    logger = logging.getLogger("optuna.study._optimize")
    logger.addHandler(kept)
    study = optuna.create_study(direction="maximize")

    def refused(_trial) -> float:
        raise InvalidRecordError("results/s/kd/rte/run.json: not a valid run record: it says "
                                 "seed 5, its config 1")

    try:
        with quiet_reported_failures(), pytest.raises(InvalidRecordError):
            study.optimize(refused, n_trials=1, catch=(RuntimeError,))
    finally:
        logger.removeHandler(kept)
    assert [trial.state.name for trial in study.trials] == ["FAIL"]
    assert [record.getMessage() for record in kept.records] == []


def test_a_ctrl_c_python_swallows_in_a_callback_still_stops_at_the_next_check():
    """SIGINT that lands in a weak reference's callback is dropped by Python (which would
    print "Exception ignored ... Traceback"); while catching_ctrl_c is active it is
    remembered and not printed, and the next check (the training loop makes one every step)
    raises it.  Other exceptions in callbacks still reach the hook that was there before.
    Outside the block SIGINT is Python's default handler again, and nothing is remembered."""
    import sys
    import weakref

    from harness.common.interrupts import (
        catching_ctrl_c,
        ctrl_c_pressed,
        raise_if_interrupted,
    )

    class Held:
        pass

    def pressed_meanwhile(_: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # a few instructions: the handler runs here, inside the callback

    def failing(_: object) -> None:
        raise ValueError("a callback's own error")

    shown: list[BaseException] = []
    before_hook = sys.unraisablehook

    def recording(unraisable) -> None:
        shown.append(unraisable.exc_value)

    sys.unraisablehook = recording
    # Python's own handler, as in a terminal (a job started in the background inherits
    # SIGINT ignored, and then nothing is caught or remembered)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with catching_ctrl_c():
            held = Held()
            reference = weakref.ref(held, pressed_meanwhile)
            del held  # the callback runs now; its KeyboardInterrupt goes no further
            assert reference() is None and ctrl_c_pressed()
            assert shown == []  # not printed
            other = Held()
            other_reference = weakref.ref(other, failing)
            del other
            assert other_reference() is None
            assert [type(error) for error in shown] == [ValueError]
            with pytest.raises(KeyboardInterrupt):
                raise_if_interrupted()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert not ctrl_c_pressed()
        raise_if_interrupted()
    finally:
        signal.signal(signal.SIGINT, before)
        hook_after = sys.unraisablehook
        sys.unraisablehook = before_hook
    assert hook_after is recording  # the block put back the hook it found

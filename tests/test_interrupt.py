"""What a failing grid cell leaves on the screen and in the store: the harness's one line,
not Optuna's traceback, while an unexpected error keeps its traceback."""

from __future__ import annotations

import logging
import subprocess
import sys

import optuna
import pytest

from harness.experiments.tuning import TrialFailed, open_storage, quiet_reported_failures
from tests.test_grid import REPO, _env, _records, grid_suite

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

OPTUNA_WARNING = "failed with parameters"  # the start of Optuna's warning about a failed trial


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

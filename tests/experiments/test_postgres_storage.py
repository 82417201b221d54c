"""Optuna's RDBStorage on a real PostgreSQL server (the `postgres_url` fixture): workers in
separate processes share one study, and heartbeats fail the trials of a worker that died."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

WORKER = """
import pathlib, sys, time, warnings
import optuna

url, study_name, worker, n_trials, sleep, barrier = sys.argv[1:7]
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2)
study = optuna.load_study(study_name=study_name, storage=storage)
if barrier:  # start optimizing together, once every worker has its storage
    (pathlib.Path(barrier) / worker).touch()
    while len(list(pathlib.Path(barrier).iterdir())) < 2:
        time.sleep(0.01)

def objective(trial):
    trial.set_user_attr("worker", int(worker))
    x = trial.suggest_float("x", -10, 10)
    time.sleep(float(sleep))
    return x * x

study.optimize(objective, n_trials=int(n_trials))
"""


def _storage(url: str) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2)


def _worker(url: str, study: str, worker: int, n_trials: int, sleep: float,
            barrier: str = "") -> subprocess.Popen:
    args = [url, study, str(worker), str(n_trials), str(sleep), barrier]
    return subprocess.Popen([sys.executable, "-c", WORKER, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.e2e
def test_two_processes_share_a_study(postgres_url, tmp_path):
    optuna.create_study(study_name="shared", storage=_storage(postgres_url))
    per_worker = 6
    procs = [_worker(postgres_url, "shared", w, per_worker, 0.1, str(tmp_path))
             for w in (0, 1)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    trials = optuna.load_study(study_name="shared", storage=_storage(postgres_url)).trials
    assert len(trials) == 2 * per_worker
    assert sorted(t.number for t in trials) == list(range(2 * per_worker))  # no duplicate
    assert len({t._trial_id for t in trials}) == len(trials)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    by_worker = collections.Counter(t.user_attrs["worker"] for t in trials)
    assert by_worker == {0: per_worker, 1: per_worker}
    # The workers ran at the same time: each started a trial before the other had finished.
    spans = {w: (min(t.datetime_start for t in trials if t.user_attrs["worker"] == w),
                 max(t.datetime_complete for t in trials if t.user_attrs["worker"] == w))
             for w in (0, 1)}
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans


@pytest.mark.e2e
def test_dead_worker_trial_is_failed_after_grace_period(postgres_url):
    study = optuna.create_study(study_name="stale", storage=_storage(postgres_url))
    proc = _worker(postgres_url, "stale", 0, 1, 600)  # one trial that never ends
    try:
        deadline = time.monotonic() + 30
        while not study.get_trials(deepcopy=False):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the worker started no trial"
            time.sleep(0.2)
        time.sleep(1.5)  # the heartbeat thread has written at least one beat
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state == optuna.trial.TrialState.RUNNING  # killed: nobody closed it

    deadline = time.monotonic() + 15  # grace_period is 2 s
    while study.get_trials(deepcopy=False)[0].state == optuna.trial.TrialState.RUNNING:
        assert time.monotonic() < deadline, "the dead worker's trial was never failed"
        time.sleep(0.5)
        optuna.storages.fail_stale_trials(study)
    assert study.get_trials(deepcopy=False)[0].state == optuna.trial.TrialState.FAIL

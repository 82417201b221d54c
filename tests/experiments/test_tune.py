"""Tuning: a deterministically named Optuna study over the plugin's search space, pruned on
every dev evaluation, resumable, whose best parameters `run --params` and the grid use; and
a worker killed inside a tuning trial, whose trial another worker retries."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from harness.api.registry import registry
from harness.cli import app
from harness.config.schema import ConfigError
from harness.experiments.grid import Grid
from harness.experiments.runner import RunOutcome, SuiteRunner
from harness.experiments.storage import open_storage
from harness.experiments.suites import load_suite
from harness.experiments.tuning import (
    TrialFailed,
    Tuner,
    TuningTarget,
    load_tuned,
    study_name,
    tuned_path,
)
from methods.kd import VanillaKD
from tests.conftest import optuna_warnings
from tests.experiments.test_grid import (
    _check_every_cell_once,
    _harness,
    _wait_for_running_cell,
    grid_suite,
    two_workers_one_killed,
)
from tests.records import run_record

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


@pytest.fixture
def suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir) -> Path:
    # STS-B's Pearson varies continuously between trials (accuracy on 24 tiny RTE rows
    # often ties), so the median pruner has something to compare.
    return grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir, {"methods": ["kd"]},
                      training={"epochs": 4, "batch_size": 8, "lr": 1e-3,
                                "log_every_steps": 1})


@pytest.mark.e2e
def test_tune_prunes_writes_parameters_and_resumes_and_run_uses_them(tmp_path, suite_file):
    results, cache = tmp_path / "results", tmp_path / "cache"
    common = ["--suite", str(suite_file), "--results", str(results), "--cache-dir", str(cache)]
    first = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                     "1", *common])  # the study and its recipe trial
    assert first.exit_code == 0, first.output
    name = study_name(Tuner(load_suite(str(suite_file)), TuningTarget("kd", "stsb", [1]),
                            results, "sqlite://").runner, TuningTarget("kd", "stsb", [1]))
    storage = open_storage(f"sqlite:///{results / 'optuna.db'}")
    # The sampler's seed follows the study name, which holds this session's temporary teacher
    # path; fixed points make the pruner's decision independent of it: three that learn,
    # then one whose learning rate is too small to move the student by the first evaluation.
    queued = optuna.load_study(study_name=name, storage=storage)
    for alpha in (0.3, 0.6, 0.8):  # not 0.5: that is the recipe trial's point
        queued.enqueue_trial({"alpha": alpha, "temperature": 2.0, "lr": 1e-3})
    queued.enqueue_trial({"alpha": 0.4, "temperature": 2.0, "lr": 1e-5})
    tune = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                    "8", *common])
    assert tune.exit_code == 0, tune.output
    study = optuna.load_study(study_name=name, storage=storage)
    states = [trial.state.name for trial in study.trials]
    assert states.count("COMPLETE") + states.count("PRUNED") == 8
    # the recipe's own point went first: what tuning gained is measured against it
    assert study.trials[0].user_attrs["recipe"]
    assert study.trials[0].params == {"alpha": 0.5, "temperature": 2.0, "lr": 1e-3}
    assert study.best_value >= study.trials[0].value
    assert study.trials[4].params["lr"] == 1e-5
    assert study.trials[4].state.name == "PRUNED"  # stopped at an early evaluation
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert all(len(t.intermediate_values) < 4 for t in pruned)  # 4 epochs, 1 eval each
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert all(len(t.intermediate_values) == 4 for t in complete)
    # trials' runs are recorded apart from the leaderboard
    assert not (results / "tiny").exists()
    trial_records = list((results / "tuning" / name).glob("**/*.json"))
    assert len(trial_records) == len(complete)

    params = load_tuned(name, results)  # by study name
    best = study.best_trial
    assert params.overrides == best.user_attrs["overrides"]
    assert set(params.overrides) == {"params.alpha", "params.temperature", "stages.task.lr"}
    document = yaml.safe_load(params.path.read_text())
    assert document["objective"]["value"] == best.value
    assert [entry["state"] for entry in document["history"]] == [s.lower() for s in states]
    assert document["recipe"]["trial"] == 0

    again = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                     "8", *common])  # the same study, already complete
    assert again.exit_code == 0 and f"study {name}" in again.output
    assert len(optuna.load_study(study_name=name, storage=open_storage(
        f"sqlite:///{results / 'optuna.db'}")).trials) == len(study.trials)

    run = CliRunner().invoke(app, ["run", "--method", "kd", "--tasks", "stsb", "--seeds", "1",
                                   "--params", str(params.path), *common])
    assert run.exit_code == 0, run.output
    record = json.loads(next((results / "tiny").glob("**/*.json")).read_text())
    assert record["tuned"]["study"] == name
    assert record["config"]["params"]["alpha"] == params.overrides["params.alpha"]
    assert record["config"]["stages"]["task"]["lr"] == params.overrides["stages.task.lr"]
    # the best trial ran seed 1 with these parameters: the same configuration, same score
    assert record["main_score"] == pytest.approx(best.value)

    wrong = CliRunner().invoke(app, ["run", "--method", "kd", "--tasks", "rte", "--params",
                                     name, *common])
    assert wrong.exit_code == 2 and "which this run does not include" in wrong.output

    # the grid takes the same file: its kd/stsb cell is the tuned run just recorded
    dry = CliRunner().invoke(app, ["grid", "--dry-run", "--params", name, *common])
    assert dry.exit_code == 0, dry.output
    rows = {line.split()[2]: line for line in dry.output.splitlines()
            if line.startswith("kd ")}
    assert "done" in rows["stsb"] and record["run_id"][:16] in rows["stsb"]
    assert "todo" in rows["rte"]


def test_study_names_follow_what_is_tuned(tmp_path, suite_file):
    def name(target: TuningTarget, *sets: str) -> str:
        suite = load_suite(str(suite_file), list(sets))
        return Tuner(suite, target, tmp_path, "sqlite://").name

    base = name(TuningTarget("kd", "rte", [1]))
    assert base.startswith("tune-tiny-kd-rte-")
    assert name(TuningTarget("kd", "rte", [1])) == base
    assert name(TuningTarget("kd", "rte", [1, 2])) != base
    assert name(TuningTarget("kd", "stsb", [1])) != base
    assert name(TuningTarget("kd", "rte", [1]), "training.batch_size=4") != base
    assert name(TuningTarget("kd", "rte", [1], task_epochs=2.0)) != base


def test_the_recipe_point_is_read_from_the_resolved_recipe(tmp_path, suite_file):
    def point(*sets: str) -> dict:
        suite = load_suite(str(suite_file), list(sets))
        return Tuner(suite, TuningTarget("kd", "rte", [1]), tmp_path, "sqlite://").recipe_point()

    assert point() == {"alpha": 0.5, "temperature": 2.0, "lr": 1e-3}
    assert point("methods.kd.params.alpha=0.3", "training.lr=2e-4") == {
        "alpha": 0.3, "temperature": 2.0, "lr": 2e-4}
    # a value outside the space (T 3 is not among kd's 1, 2, 4, 8): nothing is queued
    assert point("methods.kd.params.temperature=3") == {}


def test_parameter_files_are_checked(tmp_path):
    with pytest.raises(FileNotFoundError, match="run `harness tune` first"):
        load_tuned("tune-nothing", tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: kd\n")
    with pytest.raises(ConfigError, match="missing task, overrides"):
        load_tuned(str(bad), tmp_path)
    bad.write_text("method: kd\ntask: rte\noverrides: [1, 2]\n")
    with pytest.raises(ConfigError, match="overrides: expected a mapping"):
        load_tuned(str(bad), tmp_path)


def test_a_grid_queue_has_one_name_before_and_after_its_tuning(tmp_path, tiny_data_dir,
                                                              tiny_teacher_dir):
    """A worker plans as it starts, before the tuning; one started later plans after it:
    both must join one queue whichever trial won (the recipe's own or another), while each
    cell runs with the tuned parameters."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["kd"], "tasks": ["stsb"], "seeds": [1],
                       "budget": {"task_epochs": 2, "tuning_trials": 2,
                                  "tuning_seeds": [1]}})
    results = tmp_path / "results"
    suite = load_suite(str(path))

    def fresh() -> Grid:
        return Grid(suite, results, f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "cache",
                    log=lambda _: None)

    before = fresh()
    [untuned] = before.plan()
    assert untuned.status == "tune"
    tuner = before.tuner(before.cells[0])
    tuned = tuned_path(results, tuner.name)
    tuned.parent.mkdir(parents=True, exist_ok=True)
    tuned.write_text(yaml.safe_dump({"study": tuner.name, "method": "kd", "task": "stsb",
                                     "overrides": {"params.alpha": 0.25,
                                                   "params.temperature": 3.0}}))
    after = fresh()
    [planned] = after.plan()
    assert planned.status == "todo" and planned.run_id is not None
    assert after.study_name == before.study_name


@pytest.mark.slow
def test_grid_tunes_then_runs_and_a_worker_killed_mid_trial_is_retried(
        postgres_url, tmp_path, tiny_data_dir, tiny_teacher_dir):
    """tune-then-run on PostgreSQL: 4 trials per method and task, then the cells with the
    best parameters; one worker is SIGKILLed inside a tuning trial."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["kd"], "tasks": ["stsb"], "seeds": [1, 2],
                       "budget": {"task_epochs": 8, "tuning_trials": 4,
                                  "tuning_seeds": [1]}})
    results, cache = tmp_path / "results", tmp_path / "cache"
    suite = load_suite(str(path))
    grid = Grid(suite, results, postgres_url, cache, log=lambda _: None)
    grid.runner.teacher("stsb")
    tuner = grid.tuner(grid.cells[0])
    common = ["worker", "--storage", postgres_url, "--suite", str(path), "--results",
              str(results), "--cache-dir", str(cache), "--poll-seconds", "0.5"]
    running, _, _ = two_workers_one_killed(common, postgres_url, tuner.name)
    study = optuna.load_study(study_name=tuner.name, storage=open_storage(postgres_url))
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") + states.count("PRUNED") == 4
    assert study.trials[running.number].state.name == "FAIL"
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retried) == 1 and retried[0].params == study.trials[running.number].params
    assert retried[0].state.name in {"COMPLETE", "PRUNED"}

    _check_every_cell_once(grid, results)
    best = load_tuned(tuner.name, results).overrides
    # where the recipe's own point won, the cells are the untuned cells' runs (one run id):
    # recorded as the recipe's, whichever command makes them first
    own = grid.runner.planner.plan("kd", "stsb", 1,
                                   grid.variation(grid.cells[0], best)).recipe_values
    for record_path in (results / "tiny").glob("**/*.json"):
        record = json.loads(record_path.read_text())
        assert record["grid"]
        if own:
            assert "tuned" not in record and "overrides" not in record["variation"]
        else:
            assert record["tuned"]["study"] == tuner.name
        assert record["config"]["params"]["alpha"] == best["params.alpha"]


def _kd_stsb_tuning(tmp_path: Path, suite_file: Path, trials: int
                    ) -> tuple[list[str], str, str]:
    """The `tune` command of kd on STS-B with long trials (12 epochs, so a test can stop
    one mid-way), its storage and its study's name."""
    results, cache = tmp_path / "results", tmp_path / "cache"
    command = ["tune", "--method", "kd", "--task", "stsb", "--trials", str(trials), "--suite",
               str(suite_file), "--results", str(results), "--cache-dir", str(cache),
               "--set", "training.epochs=12"]
    storage = f"sqlite:///{results / 'optuna.db'}"
    suite = load_suite(str(suite_file), ["training.epochs=12"])
    return command, storage, Tuner(suite, TuningTarget("kd", "stsb", [1]), results,
                                   storage).name


@pytest.mark.slow
def test_tune_killed_mid_trial_resumes_and_retries_that_trial(tmp_path, suite_file):
    results = tmp_path / "results"
    common, storage, name = _kd_stsb_tuning(tmp_path, suite_file, trials=3)
    first = _harness(*common)
    running = _wait_for_running_cell(storage, name, first.pid)
    time.sleep(0.5)
    first.send_signal(signal.SIGKILL)
    first.wait()

    second = _harness(*common)  # same command: same study, the dead trial re-queued at once
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    assert study.trials[running.number].state.name == "FAIL"
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retried) == 1 and retried[0].params == study.trials[running.number].params
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") + states.count("PRUNED") == 3
    assert load_tuned(name, results).study == name


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")  # ask(), not optimize()
def test_parallel_workers_propose_their_own_parameters_and_one_alone_repeats(tmp_path,
                                                                              suite_file):
    """Workers sharing a study must not sample what another worker sampled (one sampler
    seed per study had every worker propose the same parameters in turn), while a study
    one worker runs alone draws the same parameters every time."""
    suite = load_suite(str(suite_file))

    def proposals(storage: str, workers: int, trials: int = 7) -> list[dict]:
        tuners = [Tuner(suite, TuningTarget("kd", "rte", [1]), tmp_path / "results", storage,
                        tmp_path / "cache", log=lambda _: None) for _ in range(workers)]
        studies = [tuner.study() for tuner in tuners]  # each worker's own sampler
        drawn = []
        for number in range(trials):  # the workers take turns asking for a trial
            study = studies[number % workers]
            trial = study.ask()
            drawn.append(tuners[number % workers]._search_space(trial))
            study.tell(trial, 50.0)
        return drawn

    parallel = proposals(f"sqlite:///{tmp_path / 'two.db'}", workers=2)
    assert len({json.dumps(point, sort_keys=True) for point in parallel}) == len(parallel)
    alone = proposals(f"sqlite:///{tmp_path / 'one.db'}", workers=1)
    assert proposals(f"sqlite:///{tmp_path / 'again.db'}", workers=1) == alone
    assert alone[0] == parallel[0]  # the recipe's own point, queued first


@pytest.mark.e2e
def test_a_study_whose_every_trial_fails_stops_and_says_so(tmp_path, suite_file):
    # A weight decay that blows the weights up at the first step, whatever the searched
    # learning rate: every trial's run diverges and writes a failed record.
    diverging = ["training.weight_decay=1.0e+30", "training.max_grad_norm=null",
                 "training.warmup_ratio=0"]
    results, cache = tmp_path / "results", tmp_path / "cache"
    lines: list[str] = []
    tuner = Tuner(load_suite(str(suite_file), diverging), TuningTarget("kd", "stsb", [1]),
                  results, f"sqlite:///{results / 'optuna.db'}", cache, log=lines.append)
    results.mkdir()
    run_trial, asked = tuner.run_trial, []

    def counted(study) -> None:
        asked.append(study)
        if len(asked) > 6:
            raise AssertionError("optimize(2) asked for a 7th trial after 6 failed ones")
        run_trial(study)

    tuner.run_trial = counted
    tuner.optimize(2, poll_seconds=0.01)
    assert len(asked) == 2
    counts = tuner.counts()
    assert (counts["fail"], counts["complete"]) == (2, 0)
    assert any("stopping: the runs of 2 trials failed, as many as the 2 trials asked for"
               in line for line in lines)
    with pytest.raises(RuntimeError, match="no complete trial") as error:
        tuner.write_best()
    assert "non-finite loss" in str(error.value)
    assert not tuned_path(results, tuner.name).exists()

    # the command resumes the study, runs no more trials and fails with that message
    sets = [arg for assignment in diverging for arg in ("--set", assignment)]
    tune = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                    "2", "--suite", str(suite_file), "--results",
                                    str(results), "--cache-dir", str(cache), *sets])
    assert tune.exit_code != 0, tune.output
    assert f"study {tuner.name}: no complete trial" in tune.output
    assert tuner.counts()["fail"] == 2


@pytest.mark.e2e
def test_a_bug_in_a_trial_stops_the_study_with_one_traceback_and_queues_it_again(
        tmp_path, suite_file, monkeypatch):
    """An unexpected error other than a RuntimeError: the command prints its traceback
    once (Optuna logs nothing) and exits 1, and the trial's parameters are queued again,
    as a Ctrl-C's are, for the study to run once it is fixed."""
    results = tmp_path / "results"
    results.mkdir()

    def buggy(self, *args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(SuiteRunner, "run_one", buggy)
    with optuna_warnings() as warned:
        tune = CliRunner().invoke(app, [
            "tune", "--method", "kd", "--task", "stsb", "--trials", "2", "--suite",
            str(suite_file), "--results", str(results), "--cache-dir", str(tmp_path / "cache")])
    assert warned == []
    assert tune.exit_code == 1, tune.output
    assert tune.output.count("Traceback") == 1 and "TypeError: a bug" in tune.output
    storage = open_storage(f"sqlite:///{results / 'optuna.db'}")
    [summary] = optuna.get_all_study_summaries(storage)
    assert (f"error: trial 0 of study {summary.study_name} stopped with TypeError: a bug\n"
            "its parameters are queued again; once the error is fixed the same command "
            "resumes the study") in tune.output
    stopped, queued = optuna.load_study(study_name=summary.study_name, storage=storage).trials
    assert (stopped.state.name, queued.state.name) == ("FAIL", "WAITING")
    assert queued.params == stopped.params


@pytest.mark.e2e
def test_a_seed_already_recorded_reports_its_evaluations_so_later_seeds_keep_their_steps(
        tmp_path, suite_file):
    """A trial whose seed 1 is in the study's store (a retried trial's, say) does not train
    it again: its 4 recorded evaluations are reported as steps 0-3, so seed 2's are 4-7,
    the steps at which the pruner compares every trial's seed 2."""
    results, cache = tmp_path / "results", tmp_path / "cache"
    common = ["--suite", str(suite_file), "--results", str(results), "--cache-dir", str(cache)]
    ran = CliRunner().invoke(app, ["run", "--method", "kd", "--tasks", "stsb", "--seeds", "1",
                                   *common])  # the recipe's point, which the first trial is
    assert ran.exit_code == 0, ran.output
    [plain] = sorted(results.rglob("*.json"))
    name = Tuner(load_suite(str(suite_file)), TuningTarget("kd", "stsb", [1, 2]), results,
                 "sqlite://").name
    recorded = results / "tuning" / name / plain.relative_to(results)
    recorded.parent.mkdir(parents=True)
    shutil.copy(plain, recorded)
    tune = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                    "1", "--seeds", "1,2", *common])
    assert tune.exit_code == 0, tune.output
    assert "[skip]" in tune.output and recorded.read_bytes() == plain.read_bytes()
    [trial] = optuna.load_study(study_name=name, storage=open_storage(
        f"sqlite:///{results / 'optuna.db'}")).trials
    assert trial.user_attrs["recipe"] and trial.state.name == "COMPLETE"
    assert sorted(trial.intermediate_values) == list(range(8))
    evaluations = json.loads(plain.read_text())["stages"][-1]["evaluations"]
    assert [trial.intermediate_values[step] for step in range(4)] == [
        evaluation["pearson"] for evaluation in evaluations]


@pytest.mark.slow
@pytest.mark.parametrize(("url", "says"), [
    ("notaurl", "not a database URL this can open"),
    ("bogus://x", "not a database URL this can open"),
    ("sqlite:///{missing}/x.db", "cannot open the database (unable to open database file)"),
    ("sqlite://", "an in-memory SQLite database; a study must persist"),
    ("sqlite:///", "an in-memory SQLite database; a study must persist"),
    ("sqlite:///:memory:", "an in-memory SQLite database; a study must persist"),
])
def test_a_storage_that_cannot_be_opened_is_named_not_a_traceback(tmp_path, url, says):
    from harness.experiments.storage import open_storage

    url = url.format(missing=tmp_path / "no-such-folder")
    with pytest.raises(RuntimeError) as info:
        open_storage(url)
    assert str(info.value).startswith(f"--storage {url}: {says}")


@pytest.mark.e2e
def test_params_that_name_a_folder_and_zero_trials_are_refused(tmp_path):
    from harness.cli import app
    from harness.experiments.tuning import load_tuned

    (tmp_path / "a-folder").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a file nor a study"):
        load_tuned(str(tmp_path / "a-folder"), tmp_path)
    done = CliRunner().invoke(app, ["tune", "--suite", "glue-cpu", "--method", "kd",
                                    "--task", "rte", "--trials", "0", "--results",
                                    str(tmp_path / "r")])
    assert done.exit_code == 2 and "--trials" in done.output
    assert not (tmp_path / "r").exists()


@pytest.mark.e2e
@pytest.mark.parametrize(("key", "says"), [
    ("params.temperatur", "kd-misspelt has no parameter 'temperatur'; its parameters: "
                          "alpha, temperature"),
    ("stages.taks.lr", "kd-misspelt has no stage 'taks'; its stages: task"),
    ("foo.bar", "not a recipe override; expected params.<name>, stages.<stage>.<field> or "
                "loss_weights.<term>"),
    ("stages.task.lrr", "a stage has no training setting 'lrr'; the settings: epochs, "),
])
def test_a_search_space_key_the_recipe_cannot_take_is_refused_before_any_study(
        tmp_path, suite_file, key, says):
    """A misspelt key was read by the recipe point before anything checked it: a bare
    `error: temperatur` or a traceback, and an empty study left in the storage."""

    class Misspelt(VanillaKD):
        name = "kd-misspelt"

        def search_space(self, trial) -> dict:
            return {"params.alpha": trial.suggest_float("alpha", 0.1, 0.9),
                    key: trial.suggest_float("x", 1e-5, 1e-3, log=True)}

    registry.register(Misspelt)
    try:
        results = tmp_path / "results"
        tune = CliRunner().invoke(app, ["tune", "--method", "kd-misspelt", "--task", "stsb",
                                        "--trials", "1", "--suite", str(suite_file),
                                        "--results", str(results),
                                        "--cache-dir", str(tmp_path / "cache")])
    finally:
        registry._methods.pop("kd-misspelt", None)
    assert tune.exit_code == 2, tune.output
    assert "Traceback" not in tune.output
    [line] = [line for line in tune.output.splitlines() if line.strip()]
    assert line.startswith(f"error: tests/experiments/{Path(__file__).name}:")  # the space's source
    assert f": search space of kd-misspelt: {key!r}: {says}" in line
    assert not (results / "optuna.db").exists()  # no study, not even an empty one


@pytest.mark.e2e
@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///"])
def test_tune_refuses_an_in_memory_storage_before_any_trial(tmp_path, suite_file, url):
    """Trials used to run on it while the heartbeat thread, on a connection of its own,
    found no tables ("no such table: trial_heartbeats"), then no trial was complete."""
    results = tmp_path / "results"
    tune = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                    "1", "--storage", url, "--suite", str(suite_file),
                                    "--results", str(results),
                                    "--cache-dir", str(tmp_path / "cache")])
    assert tune.exit_code == 2, tune.output
    assert [line for line in tune.output.splitlines() if line.strip()] == [
        f"error: --storage {url}: an in-memory SQLite database; a study must persist: pass "
        "a file path, e.g. sqlite:///path/study.db"]
    assert not list(results.rglob("*.json"))  # no trial ran


@pytest.mark.e2e
def test_tuned_parameters_that_are_the_recipes_own_are_its_run_in_either_order(
        tmp_path, suite_file):
    """When the best trial is the recipe's own point, `run --params` is the plain run (one
    run id). Its record was annotated only by the command that came first, so the table
    showed `kd` and `kd [tuned]` for one configuration, or no tuned row, by command order."""
    own = {"params.alpha": 0.5, "params.temperature": 2.0, "stages.task.lr": 1e-3}
    assert Tuner(load_suite(str(suite_file)), TuningTarget("kd", "stsb", [1]), tmp_path,
                 "sqlite://").recipe_point() == {"alpha": 0.5, "temperature": 2.0, "lr": 1e-3}
    params = tmp_path / "own.yaml"
    params.write_text(yaml.safe_dump({"study": "tune-tiny-kd-stsb-own", "suite": "tiny",
                                      "method": "kd", "task": "stsb", "overrides": own}))
    tables = []
    for first, second in ((["--params", str(params)], []), ([], ["--params", str(params)])):
        results = tmp_path / f"results-{len(tables)}"
        common = ["--method", "kd", "--tasks", "stsb", "--seeds", "1", "--suite",
                  str(suite_file), "--results", str(results), "--cache-dir",
                  str(tmp_path / "cache")]
        for extra in (first, second):
            ran = CliRunner().invoke(app, ["run", *extra, *common])
            assert ran.exit_code == 0, ran.output
            said = [line for line in ran.output.splitlines()
                    if "the tuned parameters are the recipe's own" in line]
            assert len(said) == (1 if extra else 0), ran.output
        [record] = results.rglob("*.json")  # one run id, one record
        document = json.loads(record.read_text())
        assert "tuned" not in document and "variation" not in document
        table = CliRunner().invoke(app, ["table", "--suite", str(suite_file), "--results",
                                         str(results)])
        assert table.exit_code == 0, table.output
        tables.append(table.output)
    assert "[tuned]" not in tables[0] and "| kd " in tables[0]
    assert tables[0] == tables[1]


@pytest.mark.e2e
def test_run_params_trains_the_student_the_parameters_were_tuned_on(tmp_path, suite_file):
    """`tune --student` writes its shape into the parameter file; `run --params` applied
    the parameters to the method's own student instead, and marked that run tuned."""
    results, cache = tmp_path / "results", tmp_path / "cache"
    common = ["--suite", str(suite_file), "--results", str(results), "--cache-dir", str(cache)]
    tune = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                    "1", "--student", "tiny-wide", *common])
    assert tune.exit_code == 0, tune.output
    [path] = (results / "tuned").glob("*.yaml")
    assert yaml.safe_load(path.read_text())["student"] == "tiny-wide"
    run = CliRunner().invoke(app, ["run", "--method", "kd", "--tasks", "stsb", "--seeds", "1",
                                   "--params", str(path), *common])
    assert run.exit_code == 0, run.output
    [record] = (results / "tiny").glob("**/*.json")
    document = json.loads(record.read_text())
    assert document["student_shape"] == "tiny-wide"
    assert document["variation"]["student"] == "tiny-wide"
    assert "tuned on student tiny-wide" in run.output
    params = load_tuned(str(path), results)
    assert params.student == "tiny-wide"
    # the study's only trial ran this configuration on seed 1: the same run, the same score
    study = optuna.load_study(study_name=params.study, storage=open_storage(
        f"sqlite:///{results / 'optuna.db'}"))
    assert document["main_score"] == pytest.approx(study.best_value)

    # a file tuned on a shape the suite does not define is refused, naming it
    document = yaml.safe_load(path.read_text())
    document["student"] = "tiny-gone"
    gone = tmp_path / "gone.yaml"
    gone.write_text(yaml.safe_dump(document))
    refused = CliRunner().invoke(app, ["run", "--method", "kd", "--tasks", "stsb", "--params",
                                       str(gone), *common])
    assert refused.exit_code == 2, refused.output
    assert f"{gone}: tuned on student 'tiny-gone', which suite tiny does not define" in \
        refused.output


@pytest.mark.e2e
def test_the_printed_run_command_works_as_printed(tmp_path, suite_file):
    """The "use them:" line left out --results (and the --set assignments): copied, it
    looked for the study's parameters in the default store ("neither a file nor a
    study")."""
    import shlex

    results, cache = tmp_path / "a store", tmp_path / "cache"  # a space, to be quoted
    tune = CliRunner().invoke(app, ["tune", "--method", "kd", "--task", "stsb", "--trials",
                                    "1", "--suite", str(suite_file), "--set",
                                    "training.epochs=2", "--results", str(results),
                                    "--cache-dir", str(cache)])
    assert tune.exit_code == 0, tune.output
    [use] = [line.removeprefix("use them: ") for line in tune.output.splitlines()
             if line.startswith("use them: ")]
    command = shlex.split(use)
    assert command[:2] == ["harness", "run"]
    run = CliRunner().invoke(app, command[1:])
    assert run.exit_code == 0, run.output
    [record] = (results / "tiny").glob("**/*.json")
    document = json.loads(record.read_text())
    assert document["config"]["stages"]["task"]["epochs"] == 2  # the recipe it tuned
    [trial] = optuna.load_study(study_name=command[-1], storage=open_storage(
        f"sqlite:///{results / 'optuna.db'}")).trials
    assert document["main_score"] == pytest.approx(trial.value)


@pytest.mark.slow
def test_ctrl_c_in_a_trial_says_so_queues_its_parameters_again_and_exits_130(tmp_path,
                                                                           suite_file):
    """Ctrl-C used to print KeyboardInterrupt's traceback and leave the trial failed, its
    parameters never tried (the next trial drew new ones): a study one worker runs alone
    did not repeat. Now it follows a killed worker's trial: queued again, same parameters."""
    common, storage, name = _kd_stsb_tuning(tmp_path, suite_file, trials=2)
    first = _harness(*common)
    running = _wait_for_running_cell(storage, name, first.pid, timeout=300)
    while running.number < 1:  # a trial the sampler drew, not the recipe's queued point
        time.sleep(0.2)
        running = _wait_for_running_cell(storage, name, first.pid, timeout=300)
    time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    [said] = [line for line in output.splitlines() if "interrupted" in line]
    assert f"trial {running.number}'s parameters are queued again" in said
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    interrupted = study.trials[running.number]
    assert interrupted.state.name == "FAIL"
    [retry] = [t for t in study.trials if t.system_attrs.get("failed_trial") == running.number]
    assert retry.state.name == "WAITING" and retry.params == interrupted.params

    second = _harness(*common)  # the same command runs the queued trial next
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    retry = study.trials[retry.number]
    assert retry.state.name in {"COMPLETE", "PRUNED"} and retry.params == interrupted.params
    assert len(study.trials) == running.number + 2  # no other trial was drawn


def test_grid_params_apply_only_to_the_cells_of_the_student_they_were_tuned_on(
        tmp_path, suite_file):
    """`grid --params` applied a file tuned on one student to the method's cells of
    another; a file names its student, and a grid with no cell of it refuses the file."""
    from harness.experiments.grid import GridCell
    from harness.experiments.tuning import TunedParams

    suite = load_suite(str(suite_file))
    results = tmp_path / "results"

    def grid(student: str | None) -> Grid:
        params = TunedParams(path=tmp_path / "kd.yaml", study="s", suite=suite.record_suite,
                             method="kd", task="stsb", overrides={"params.alpha": 0.9},
                             student=student)
        return Grid(suite, results, f"sqlite:///{results / 'optuna.db'}", tmp_path / "cache",
                    log=lambda _: None, tuned=[params])

    own = suite.recipe("kd").student or suite.default_student
    cell = GridCell("kd", "stsb", 1)
    assert grid(None).tuned_overrides(cell) == {"params.alpha": 0.9}
    assert grid(own).tuned_overrides(cell) == {"params.alpha": 0.9}
    with pytest.raises(ConfigError, match=rf"tuned on student 'tiny-wide'; this grid's kd "
                                          rf"cells on stsb train {own}"):
        grid("tiny-wide")


@pytest.mark.e2e
def test_two_parameter_files_for_one_method_and_task_are_refused(tmp_path, suite_file):
    """`run` and `grid` with two --params files for kd on stsb applied the last and dropped
    the first without a word."""
    from harness.experiments.tuning import TunedParams

    suite = load_suite(str(suite_file))
    results = tmp_path / "results"
    first, second = (TunedParams(path=tmp_path / f"{name}.yaml", study=name,
                                 suite=suite.record_suite, method="kd", task="stsb",
                                 overrides={"params.alpha": alpha})
                     for name, alpha in (("low", 0.1), ("high", 0.9)))
    message = r"high\.yaml: parameters for kd on stsb, as .*low\.yaml is; pass one of them"
    with pytest.raises(ConfigError, match=message):
        Grid(suite, results, f"sqlite:///{results / 'optuna.db'}", tmp_path / "cache",
             log=lambda _: None, tuned=[first, second])
    runner = SuiteRunner(suite, results, tmp_path / "cache", log=lambda _: None)
    with pytest.raises(ConfigError, match=message):
        runner.run(["kd"], ["stsb"], [1], tuned=[first, second])
    assert not results.exists() or not any(results.glob("**/*.json"))  # nothing ran


def test_a_grid_that_crosses_students_takes_one_parameter_file_per_student(tmp_path,
                                                                           suite_file):
    """`grid --params` applies a file to the method's cells of the student it was tuned
    on, so a grid that crosses two students takes one file for each; refusing the second
    as "parameters for kd on stsb" left one shape's cells untuned."""
    from harness.experiments.grid import GridCell
    from harness.experiments.tuning import TunedParams

    suite = load_suite(str(suite_file), ["grid.students=[tiny,tiny-wide]"])
    results = tmp_path / "results"

    def params(name: str, student: str | None, alpha: float) -> TunedParams:
        return TunedParams(path=tmp_path / f"{name}.yaml", study=name,
                           suite=suite.record_suite, method="kd", task="stsb",
                           overrides={"params.alpha": alpha}, student=student)

    def grid(*files: TunedParams) -> Grid:
        return Grid(suite, results, f"sqlite:///{results / 'optuna.db'}", tmp_path / "cache",
                    log=lambda _: None, methods=["kd"], tasks=["stsb"], tuned=list(files))

    both = grid(params("narrow", "tiny", 0.2), params("wide", "tiny-wide", 0.8))
    assert both.tuned_overrides(GridCell("kd", "stsb", 1)) == {"params.alpha": 0.2}
    assert both.tuned_overrides(GridCell("kd", "stsb", 1, "tiny-wide")) == {"params.alpha": 0.8}
    one = grid(params("narrow", "tiny", 0.2))
    assert one.tuned_file(GridCell("kd", "stsb", 1, "tiny-wide")) is None
    for files in ([params("narrow", "tiny", 0.2), params("again", "tiny", 0.5)],
                  [params("any", None, 0.2), params("narrow", "tiny", 0.8)]):
        with pytest.raises(ConfigError, match=rf"{files[1].path.name}: parameters for kd on "
                                              rf"stsb, as .*{files[0].path.name} is"):
            grid(*files)



def test_a_grid_takes_a_file_tuned_on_the_methods_own_student_beside_a_crossed_ones(
        tmp_path, suite_file):
    """`harness tune` without --student (and the grid's own study of a cell of the method's
    own student) writes ``student: null``; with the file `harness tune --student tiny-wide`
    writes, a grid crossing both students refused the second ("parameters for kd on stsb,
    as ... is"), although each file is for cells of its own student."""
    from harness.experiments.grid import GridCell
    from harness.experiments.tuning import TunedParams

    suite = load_suite(str(suite_file), ["grid.students=[tiny,tiny-wide]"])
    results = tmp_path / "results"
    own = TunedParams(path=tmp_path / "own.yaml", study="own", suite=suite.record_suite,
                      method="kd", task="stsb", overrides={"params.alpha": 0.2})
    wide = TunedParams(path=tmp_path / "wide.yaml", study="wide", suite=suite.record_suite,
                       method="kd", task="stsb", overrides={"params.alpha": 0.8},
                       student="tiny-wide")
    for files in ([own, wide], [wide, own]):
        grid = Grid(suite, results, f"sqlite:///{results / 'optuna.db'}", tmp_path / "cache",
                    log=lambda _: None, methods=["kd"], tasks=["stsb"], tuned=files)
        assert grid.tuned_file(GridCell("kd", "stsb", 1)) is own
        assert grid.tuned_file(GridCell("kd", "stsb", 1, "tiny-wide")) is wide

class _FirstChoiceTrial:
    """Answers every suggestion with the low end of its range (enough to read the keys)."""

    def suggest_float(self, name, low, high, **_):
        return low

    def suggest_categorical(self, name, choices):
        return choices[0]


@pytest.mark.parametrize(("plugin", "recipe", "read"), [
    ("tinybert", {}, {"stages.prediction.lr", "params.temperature"}),
    ("tinybert", {"params": {"task_distillation": False}}, {"stages.finetune.lr"}),
    ("tinybert", {"disabled_losses": ["prediction"]}, {"stages.prediction.lr"}),
    ("distilbert", {}, {"stages.finetune.lr"}),
    ("distilbert", {"params": {"task_distillation": True}}, {"stages.task.lr"}),
    ("bilstm-soft", {}, {"stages.task.lr", "params.dropout", "params.alpha"}),
    ("bilstm-soft", {"params": {"alpha": 1.0, "augment": False}},
     {"stages.task.lr", "params.dropout"}),
    ("bert-pkd", {}, {"params.temperature", "params.alpha", "params.beta", "stages.task.lr"}),
    ("bert-pkd", {"params": {"beta": 0.0}},
     {"params.temperature", "params.alpha", "stages.task.lr"}),
])
def test_a_plugins_search_space_tunes_only_what_its_configuration_runs(plugin, recipe, read):
    """DistilBERT with task distillation tuned the lr of its ``finetune`` stage, which it
    does not run (every trial planned the same run id); TinyBERT without task distillation
    tuned the prediction stage's lr and t, and without the prediction term t: trials that
    trained the same student under other run ids.  The no-KD BiLSTM (alpha 1) tuned alpha,
    so a trial distilled from the teacher, and PKD's beta-0 KD control tuned beta back on:
    the tuned variant was no longer the variant."""
    from harness.api.registry import instantiate
    from harness.config.schema import MethodRecipe
    from harness.data.tasks import get_task

    method = instantiate(plugin, MethodRecipe(**recipe))
    space = method.search_space(_FirstChoiceTrial())
    assert set(space) == read
    stages = {stage.name for stage in method.stages(get_task("rte"))}
    assert {key.split(".")[1] for key in space if key.startswith("stages.")} <= stages


def test_a_seed_whose_failed_record_is_in_the_store_fails_its_trial_as_failed(tmp_path):
    """A trial's seed whose run is already recorded as failed is the runner's "skipped":
    the trial's line says the run failed, and why, as a grid cell's does."""
    from types import SimpleNamespace

    path = tmp_path / "run.json"
    record = run_record(status="failed", main_score=None, error="non-finite loss at step 3")
    outcome = RunOutcome("kd", "mrpc", 1, "skipped", path, None, record)
    tuner = Tuner(None, TuningTarget("kd", "mrpc", [1]), tmp_path, "sqlite://")  # type: ignore[arg-type]
    tuner._runner = SimpleNamespace(accelerator=SimpleNamespace(num_processes=1),
                                    run_one=lambda *args, **kwargs: outcome)
    tuner._name = "study"
    with pytest.raises(TrialFailed) as failed:
        tuner.evaluate({"lr": 1e-3})
    assert str(failed.value) == (f"seed 1: run failed: non-finite loss at step 3; recorded "
                                 f"at {path}")

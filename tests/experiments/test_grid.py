"""The common grid: cells, budgets, dry run, resume after a kill, and workers sharing one
Optuna storage (SQLite and a real PostgreSQL server) while one of them is SIGKILLed."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from harness.api.method import Stage
from harness.cli import app
from harness.config.schema import ConfigError, TrainConfig
from harness.experiments.grid import Grid, grid_cells
from harness.experiments.planner import Variation, scale_to_budget
from harness.experiments.runner import SuiteRunner
from harness.experiments.storage import open_storage
from harness.experiments.suites import load_suite
from tests.conftest import tiny_suite_dict

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
REPO = Path(__file__).resolve().parents[2]


def grid_suite(tmp_path: Path, data_dir: Path, teacher_dir: Path, grid: dict,
               training: dict | None = None) -> Path:
    suite = tiny_suite_dict(data_dir, teacher_dir)
    suite["training"] = training or {"epochs": 2, "batch_size": 8, "lr": 1e-3,
                                     "log_every_steps": 1}
    suite["grid"] = grid
    path = tmp_path / "grid-suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


@pytest.mark.e2e
def test_a_params_file_whose_values_make_the_recipe_fit_plans_as_harness_run_does(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """The grid named its queue by each cell's untuned configuration, resolving (and so
    checking) the recipe without the --params file's values: a file whose values make the
    recipe fit (harness run's planning check reads them) was refused with the recipe's own
    values."""
    from harness.experiments.tuning import TunedParams

    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["bert-pkd"], "tasks": ["rte"], "seeds": [1]})
    suite = load_suite(str(path), ["methods.bert-pkd.params.teacher_layers=[0,5]"])
    fix = TunedParams(tmp_path / "pkd.yaml", "pkd-rte", "tiny", "bert-pkd", "rte",
                      {"params.teacher_layers": [0, 1]})
    with pytest.raises(ConfigError, match=r"params\.teacher_layers: \[0, 5\]"):
        SuiteRunner(suite, tmp_path / "run", tmp_path / "cache").planner.check_assets(
            ["bert-pkd"], ["rte"])
    grid = Grid(suite, tmp_path / "results", f"sqlite:///{tmp_path / 'grid.db'}",
                tmp_path / "cache", log=lambda _: None, tuned=[fix])
    planned = grid.plan()
    assert [item.status for item in planned] == ["todo"]
    assert planned[0].run_id == grid.runner.planner.run_id(
        "bert-pkd", "rte", 1, Variation.of(overrides=fix.overrides))
    assert grid.study_name.startswith("grid-tiny-")


def test_workers_with_and_without_an_asset_do_not_name_two_queues(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """A --params file that switches off what needs a missing asset (tinybert's GloVe
    vectors): the queue name must not depend on the machine, so the worker that lacks the
    asset stops, naming it, rather than planning and running the whole grid on a queue of
    its own."""
    from harness.assets.checkpoints import AssetNotFoundError
    from harness.experiments.tuning import TunedParams

    glove = tmp_path / "glove.txt"
    glove.write_text("the 0.1 0.2\nmovie 0.3 0.1\n")
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["tinybert"], "tasks": ["rte"], "seeds": [1]})
    sets = [f"methods.tinybert.params.augmentation.glove_path={glove}",
            "methods.tinybert.params.augmentation.candidates=glove"]
    no_copies = TunedParams(tmp_path / "tb.yaml", "tb-rte", "tiny", "tinybert", "rte",
                            {"params.augment": False})

    def grid() -> Grid:
        return Grid(load_suite(str(path), sets), tmp_path / "results",
                    f"sqlite:///{tmp_path / 'grid.db'}", tmp_path / "cache",
                    log=lambda _: None, tuned=[no_copies])

    with_asset = grid()
    with_asset.plan()
    glove.unlink()
    with pytest.raises(AssetNotFoundError, match=r"glove\.txt does not exist"):
        grid().plan()
    assert with_asset.study_name.startswith("grid-tiny-")


# -- cells and budgets ---------------------------------------------------------------------
def test_cells_cross_methods_variants_students_tasks_and_seeds(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    suite["methods"]["kd-no-soft"] = {"base": "kd", "disabled_losses": ["soft"]}
    suite["students"]["tiny-3L"] = {"num_layers": 3, "hidden_size": 16, "num_heads": 4,
                                    "intermediate_size": 32}
    suite["grid"] = {"methods": ["kd", "bilstm-soft"], "variants": ["kd-no-soft"],
                     "students": ["tiny", "tiny-3L"], "seeds": [1, 2],
                     "budget": {"task_epochs": 2, "task_epochs_for": {"stsb": 1}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(suite))
    cells = grid_cells(load_suite(str(path)))
    # kd and its variant on both BERT shapes (their own 'tiny' stays None: same run ids as
    # plain runs); bilstm-soft builds no BERT student, so it keeps its own shape.
    per_task = [(c.method, c.student, c.seed) for c in cells if c.task == "rte"]
    assert per_task == [("kd", None, 1), ("kd", None, 2), ("kd", "tiny-3L", 1),
                        ("kd", "tiny-3L", 2), ("bilstm-soft", None, 1),
                        ("bilstm-soft", None, 2), ("kd-no-soft", None, 1),
                        ("kd-no-soft", None, 2), ("kd-no-soft", "tiny-3L", 1),
                        ("kd-no-soft", "tiny-3L", 2)]
    assert {c.task_epochs for c in cells if c.task == "rte"} == {2}
    assert {c.task_epochs for c in cells if c.task == "stsb"} == {1}
    assert [c.task for c in cells[:10]] == ["rte"] * 10  # task by task

    # a method on its recipe's own budget keeps its recipe's epochs (None) on every task
    suite["grid"]["budget"]["own_budget"] = ["bilstm-soft"]
    path.write_text(yaml.safe_dump(suite))
    cells = grid_cells(load_suite(str(path)))
    assert {c.task_epochs for c in cells if c.method == "bilstm-soft"} == {None}
    assert {c.task_epochs for c in cells if c.method == "kd" and c.task == "rte"} == {2}


def test_a_method_or_seed_named_twice_on_the_command_line_is_one_cell(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """`grid -m kd -m kd` planned each kd cell twice, and a leaderboard of those cells
    counted their runs twice."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir, {"methods": ["kd"]})
    cells = grid_cells(load_suite(str(path)), methods=["kd", "kd"], tasks=["rte", "rte"],
                       seeds=[1])
    assert [(cell.method, cell.task, cell.seed) for cell in cells] == [("kd", "rte", 1)]


@pytest.mark.parametrize("grid, message", [
    ({"methods": ["kd"], "students": ["huge"]}, "grid.students: 'huge'"),
    ({"methods": ["kd"], "variants": ["kd-x"]}, "grid.variants: 'kd-x'"),
    ({"methods": ["kd"], "budget": {"task_epoch": 3}}, "grid.budget.task_epoch: unknown key"),
    ({"methods": ["kd"], "budget": {"task_epochs": -1}}, "grid.budget.task_epochs"),
    ({"methods": ["kd"], "budget": {"task_epochs_for": {"mnli2": 1}}}, "mnli2"),
    ({"methods": ["kd"], "budget": {"own_budget": ["bilstm"]}},
     "grid.budget.own_budget.0: 'bilstm' is not one of the grid's methods"),
])
def test_grid_section_errors_name_the_key(tmp_path, tiny_data_dir, tiny_teacher_dir, grid,
                                          message):
    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    suite["grid"] = grid
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises((ConfigError, KeyError)) as error:
        load_suite(str(path))
    assert message in str(error.value)


def test_budget_scales_task_stages_in_proportion_and_leaves_matching_ones_alone():
    general = Stage("general", ("a",), teacher="pretrained", teacher_outputs=frozenset(),
                    evaluate=False, data="corpus")
    intermediate = Stage("intermediate", ("a",), data="augmented")
    prediction = Stage("prediction", ("a",), data="augmented")
    configs = {"general": TrainConfig(epochs=1), "intermediate": TrainConfig(epochs=1,
                                                                            epoch_size="task"),
               "prediction": TrainConfig(epochs=2, epoch_size="task")}
    stages = [general, intermediate, prediction]
    assert scale_to_budget(stages, configs, 3.0) == configs  # already 3 task epochs
    scaled = scale_to_budget(stages, configs, 1.5)
    assert scaled["general"] == configs["general"]  # corpus stages are not task budget
    assert (scaled["intermediate"].epochs, scaled["prediction"].epochs) == (0.5, 1.0)
    # an augmented stage counted by passes over its (larger) data is recounted in task epochs
    by_data = {**configs, "prediction": TrainConfig(epochs=2)}
    assert scale_to_budget(stages, by_data, 3.0)["prediction"].epoch_size == "task"
    with pytest.raises(ConfigError, match="max_steps"):
        scale_to_budget([prediction], {"prediction": TrainConfig(max_steps=5)}, 1.0)


@pytest.mark.e2e
def test_an_unvaried_cell_is_the_plain_run_and_a_varied_one_is_not(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir, {"methods": ["kd"]})
    runner = SuiteRunner(load_suite(str(path)), tmp_path / "r", tmp_path / "c",
                         log=lambda _: None)
    plain = runner.planner.run_id("kd", "rte", 1)
    assert runner.planner.run_id("kd", "rte", 1, Variation.of(task_epochs=2.0)) == plain
    assert runner.planner.run_id("kd", "rte", 1, Variation.of(student="tiny")) == plain
    assert runner.planner.run_id("kd", "rte", 1, Variation.of(task_epochs=3.0)) != plain
    tuned = Variation.of(overrides={"params.alpha": 0.3, "stages.task.lr": 2e-3})
    plan = runner.planner.resolve("kd", "rte", 1, tuned)
    spec, configs = plan.spec, plan.stage_configs
    assert spec["params"]["alpha"] == 0.3 and configs["task"].lr == 2e-3
    assert runner.planner.run_id("kd", "stsb", 1, tuned) != runner.planner.run_id("kd", "stsb", 1)
    with pytest.raises(ConfigError, match=r"methods\.kd\.params: alpha"):
        runner.planner.resolve("kd", "rte", 1, Variation.of(overrides={"params.alpha": 7}))
    with pytest.raises(ConfigError, match="'alpha' is not a recipe override"):
        runner.planner.resolve("kd", "rte", 1, Variation.of(overrides={"alpha": 0.1}))


# -- one machine: dry run, run, kill, resume -------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HARNESS_INFERENCE_SECONDS": "0",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **extra}


def default_sigint() -> None:
    """In a child before it starts: SIGINT at its default, so that Python turns it into
    KeyboardInterrupt as in a terminal.  A job a non-interactive shell starts in the
    background (``pytest ... &``) inherits SIGINT ignored, and its children with it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _harness(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=REPO,
                            env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=default_sigint)


def _records(root: Path) -> dict[str, list[dict]]:
    by_id = collections.defaultdict(list)
    for path in root.glob("**/*.json"):
        if not path.name.startswith("."):
            record = json.loads(path.read_text())
            by_id[record["run_id"]].append(record)
    return by_id


def _wait_for_running_cell(storage_url: str, study_name: str, pid: int | None,
                           timeout: float = 120) -> optuna.trial.FrozenTrial:
    """A trial of ``pid`` (any worker when None) that is training right now."""
    deadline = time.monotonic() + timeout
    database = Path(storage_url.removeprefix("sqlite:///"))
    while time.monotonic() < deadline:
        if storage_url.startswith("sqlite:///") and not database.exists():
            time.sleep(0.2)  # the worker creates it (and its tables) first
            continue
        try:
            study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
        except KeyError:  # not created yet
            time.sleep(0.2)
            continue
        for trial in study.get_trials(states=(optuna.trial.TrialState.RUNNING,)):
            worker = str(trial.user_attrs.get("worker", ""))
            if worker and (pid is None or worker.endswith(f":{pid}")):
                return trial
        time.sleep(0.1)
    raise AssertionError(f"no running cell of worker {pid} within {timeout}s")


def two_workers_one_killed(args: list[str], storage_url: str, study_name: str
                           ) -> tuple[optuna.trial.FrozenTrial, str, int]:
    """Two `harness` workers on one storage (1 s heartbeats, 3 s grace); the first is
    SIGKILLed inside a trial of ``study_name``.  The trial it was running, the survivor's
    output (it must finish cleanly) and the survivor's pid."""
    heartbeat = {"HARNESS_HEARTBEAT_SECONDS": "1", "HARNESS_GRACE_SECONDS": "3"}
    victim = _harness(*args, **heartbeat)
    survivor = _harness(*args, **heartbeat)
    try:
        running = _wait_for_running_cell(storage_url, study_name, victim.pid)
        time.sleep(0.5)  # inside the trial's training
        assert victim.poll() is None
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        output, _ = survivor.communicate(timeout=420)
    finally:
        for process in (victim, survivor):
            if process.poll() is None:
                process.kill()
    assert survivor.returncode == 0, output
    return running, output, survivor.pid


def _check_every_cell_once(grid: Grid, results: Path) -> optuna.Study:
    study = optuna.load_study(study_name=grid.study_name,
                              storage=open_storage(grid.storage_url))
    trials = [t for t in study.get_trials() if not t.user_attrs.get("empty")]
    complete = collections.Counter(json.dumps(t.user_attrs["cell"], sort_keys=True)
                                   for t in trials if t.state.name == "COMPLETE")
    assert len(complete) == len(grid.cells) and set(complete.values()) == {1}
    assert not [t for t in trials if t.state.name in {"RUNNING", "WAITING"}]
    records = _records(results / "tiny")
    planned = grid.plan()
    assert {item.run_id for item in planned} == set(records)
    assert all(len(copies) == 1 and copies[0]["status"] == "finished"
               for copies in records.values())
    assert {item.status for item in planned} == {"done"}
    return study


def test_cost_estimates_price_the_budget_unit_so_augmented_copies_count(tmp_path):
    """A run that trained 2 epochs of 48 rows over 448 examples seen (176 augmented copies)
    in 4.48 s costs 4.48 s per 96 budget examples: a cell of the same budget is estimated at
    its time, not at the 0.96 s that seconds per example seen would give."""
    from harness.experiments.grid import CostModel, budget_examples, budget_rules
    from harness.experiments.store import ResultsStore
    from tests.records import run_record

    record = run_record(
        method="bilstm-soft", task="rte", student_shape="BiLSTM-150", wall_seconds=5.0,
        train_seconds=4.48, data={"train_examples": 48},
        config={"plugin": "bilstm-soft", "stages": {"task": {"epochs": 2.0}}},
        stages=[{"name": "task", "steps": 56, "examples_seen": 448, "seconds": 4.48,
                 "examples_per_second": 100.0}])
    assert budget_examples(record) == 96
    store = ResultsStore(tmp_path)
    store.write(store.record_path("s", "bilstm-soft", "rte", "r"), record)
    # a smoke run capped at 2 steps: 0.3 s for 96 budget examples it never trained
    capped = run_record(
        method="bilstm-soft", task="rte", student_shape="BiLSTM-150", wall_seconds=1.3,
        train_seconds=0.3, data={"train_examples": 48}, config={
            "plugin": "bilstm-soft", "stages": {"task": {"epochs": 2.0, "max_steps": 2}}},
        stages=[{"name": "task", "steps": 2, "examples_seen": 16, "seconds": 0.3,
                 "examples_per_second": 53.0}])
    store.write(store.record_path("s", "bilstm-soft", "rte", "capped"), capped)
    costs = CostModel.from_store(tmp_path)
    plain = budget_rules([{"epochs": 2.0, "max_steps": None, "epoch_size": "data"}])
    assert costs.estimate("bilstm-soft", "bilstm-soft", "rte", "BiLSTM-150", 96, plain) == \
        pytest.approx(4.48 + 0.52)
    # a budgeted grid cell counts its augmented epochs in task epochs: neither run was
    # trained so, so neither prices it
    per_task = budget_rules([{"epochs": 2.0, "max_steps": None, "epoch_size": "task"}])
    assert costs.estimate("bilstm-soft", "bilstm-soft", "rte", "BiLSTM-150", 96,
                          per_task) is None


@pytest.mark.e2e
def test_set_warnings_name_the_grids_own_variants_and_tasks(tmp_path, tiny_data_dir,
                                                              tiny_teacher_dir):
    """A --set that reaches a grid variant, or a task given by its display name, is no
    warning; one for a task outside the grid's own tasks is."""
    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    suite["methods"]["kd-hot"] = {"base": "kd", "params": {"temperature": 4.0}}
    suite["grid"] = {"methods": ["kd"], "variants": ["kd-hot"], "tasks": ["rte"],
                     "seeds": [1]}
    path = tmp_path / "grid-suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    common = ["grid", "--suite", str(path), "--results", str(tmp_path / "results"),
              "--cache-dir", str(tmp_path / "cache"), "--dry-run"]

    def warnings(*sets: str, tasks: str | None = None) -> list[str]:
        options = [item for assignment in sets for item in ("--set", assignment)]
        result = CliRunner().invoke(app, [*common, *options,
                                          *(["--tasks", tasks] if tasks else [])])
        assert result.exit_code == 0, result.output
        return [line for line in result.output.splitlines() if line.startswith("warning:")]

    assert warnings("methods.kd-hot.params.temperature=7") == []
    assert warnings("data.max_train_examples.stsb=10", tasks="STS-B") == []
    assert warnings("data.max_train_examples.stsb=10") == [
        "warning: --set data.max_train_examples.stsb=10 changes none of these runs: they do "
        "not include task stsb (nor a general distillation on its sentences)"]


@pytest.mark.e2e
def test_grid_dry_run_then_run_killed_and_resumed(tmp_path, tiny_data_dir, tiny_teacher_dir):
    # 4 cells of a second or two each (an evaluation per epoch): long enough to be killed
    # inside one.
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["finetune", "kd"], "tasks": ["rte"], "seeds": [1, 2],
                       "budget": {"task_epochs": 12}})
    results, cache = tmp_path / "results", tmp_path / "cache"
    common = ["--suite", str(path), "--results", str(results), "--cache-dir", str(cache)]
    dry = CliRunner().invoke(app, ["grid", *common, "--dry-run",
                                   "--set", "task_training.mrpc.epochs=5"])  # no rte cell
    assert dry.exit_code == 0, dry.output
    assert "warning: --set task_training.mrpc.epochs=5 changes none of these runs" in \
        dry.output
    assert "4 cells; budget: task epochs 12.0" in dry.output
    assert dry.output.count(" todo ") == 4
    # nothing in the store to time the cells by: said so, not "0s of one worker"
    assert (f"estimated cost of the cells to run: cannot be estimated: the results store "
            f"({results}) has no earlier record of their task and student") in dry.output
    assert "of one worker" not in dry.output
    assert not (results / "tiny").exists()  # nothing ran

    first = _harness("grid", *common)
    grid = Grid(load_suite(str(path)), results, f"sqlite:///{results / 'optuna.db'}", cache,
                log=lambda _: None)
    running = _wait_for_running_cell(grid.storage_url, grid.study_name, first.pid)
    while len(_records(results / "tiny")) < 1:  # at least one cell finished
        assert first.poll() is None, first.communicate()[0]
        time.sleep(0.1)
    running = _wait_for_running_cell(grid.storage_url, grid.study_name, first.pid)
    first.send_signal(signal.SIGKILL)
    first.wait()
    done_before = len(_records(results / "tiny"))
    assert 1 <= done_before < 4

    dry = CliRunner().invoke(app, ["grid", *common, "--dry-run"])
    assert dry.output.count(" done ") == done_before
    [cost] = [line for line in dry.output.splitlines() if line.startswith("estimated cost")]
    assert cost.endswith(" of one worker"), cost  # every cell left priced by those done

    second = _harness("grid", *common)
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    assert ("4 of 4 cells complete, 0 failed, 1 queued again (a worker died or was stopped)"
            in output)
    study = _check_every_cell_once(grid, results)
    killed = study.trials[running.number]
    assert killed.state.name == "FAIL"  # the dead process's cell, retried once

    table = CliRunner().invoke(app, ["table", "--suite", str(path), "--results", str(results),
                                     "--grid"])
    assert table.exit_code == 0, table.output
    rows = {line.split("|")[1].strip(): line for line in table.output.splitlines()
            if line.startswith("| ") and "method" not in line}
    assert set(rows) == {"finetune", "kd"}
    scores = {record["method"]: [] for copies in _records(results / "tiny").values()
              for record in copies}
    for copies in _records(results / "tiny").values():
        scores[copies[0]["method"]].append(copies[0]["main_score"])
    assert f"{sum(scores['kd']) / 2:.2f}" in rows["kd"]  # the mean over the grid's 2 seeds


# -- many workers on one storage ----------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.mark.e2e
def test_two_workers_one_killed_mid_cell_every_cell_finishes_once(
        storage_url, tmp_path, tiny_data_dir, tiny_teacher_dir):
    # 4 cells of one task: the survivor runs three while the dead worker's heartbeat
    # expires, then retries its cell
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["finetune", "kd"], "tasks": ["rte"], "seeds": [1, 2],
                       "budget": {"task_epochs": 10}})
    results, cache = tmp_path / "results", tmp_path / "cache"
    suite = load_suite(str(path))
    grid = Grid(suite, results, storage_url, cache, log=lambda _: None)
    for task in suite.tasks:  # teachers first: the test is about cells
        grid.runner.teacher(task)
    common = ["worker", "--storage", storage_url, "--suite", str(path), "--results",
              str(results), "--cache-dir", str(cache), "--poll-seconds", "0.5"]
    running, output, survivor_pid = two_workers_one_killed(common, storage_url,
                                                           grid.study_name)
    assert f"{len(grid.cells)} of {len(grid.cells)} cells complete" in output
    study = _check_every_cell_once(grid, results)
    killed = study.trials[running.number]
    assert killed.state.name == "FAIL"  # failed by the heartbeat check, not by its worker
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retries) == 1 and retries[0].state.name == "COMPLETE"
    assert retries[0].user_attrs["cell"] == killed.user_attrs["cell"]
    assert retries[0].user_attrs["worker"].endswith(f":{survivor_pid}")
    for copies in _records(results / "tiny").values():  # the grid's budget, not the recipe's
        assert copies[0]["variation"] == {"task_epochs": 10.0}
        assert copies[0]["grid"]["study"] == grid.study_name
        assert copies[0]["config"]["stages"]["task"]["epochs"] == 10.0


OPEN_AND_CREATE = """
import os, sys, optuna
from harness.experiments.storage import open_storage
optuna.create_study(study_name=f"worker-{os.getpid()}", storage=open_storage(sys.argv[1]))
"""


@pytest.mark.e2e
def test_workers_starting_together_on_a_new_database_all_get_it(tmp_path):
    """Workers started at once on a new SQLite file race to create its tables; without a
    retry some die with "table ... already exists" (seen in CI)."""
    for attempt in range(2):
        url = f"sqlite:///{tmp_path / f'new-{attempt}.db'}"
        processes = [subprocess.Popen([sys.executable, "-c", OPEN_AND_CREATE, url], cwd=REPO,
                                      env=_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
                     for _ in range(4)]
        outputs = [process.communicate(timeout=120)[0] for process in processes]
        assert [process.returncode for process in processes] == [0, 0, 0, 0], outputs
        assert len(optuna.get_all_study_summaries(open_storage(url))) == 4


def test_a_grid_whose_run_ids_change_is_a_new_queue(tmp_path, tiny_data_dir,
                                                     tiny_teacher_dir):
    """The queue is named by its cells and their run ids: after a change of data or
    configuration (new run ids for the same cells) the workers fill a new queue instead of
    finding every cell completed by runs that no longer answer the plan."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["finetune"], "tasks": ["rte"], "seeds": [1]})
    results, cache = tmp_path / "results", tmp_path / "cache"

    def grid(*overrides: str) -> Grid:
        return Grid(load_suite(str(path), list(overrides)), results,
                    f"sqlite:///{results / 'optuna.db'}", cache, log=lambda _: None)

    same, again = grid(), grid()
    assert same.study_name == again.study_name
    changed = grid("training.lr=2e-4")
    assert changed.cells == same.cells
    assert changed.study_name != same.study_name


def test_workers_with_and_without_native_bf16_share_one_queue(tmp_path, tiny_data_dir,
                                                               tiny_teacher_dir):
    """A recipe whose precision is ``auto`` trains in bf16 on a CPU with AMX and in fp32 on
    one without (other run ids), but it is one grid: workers on both kinds of CPU pop its
    cells from the same queue instead of each running all of them."""
    from harness.common.precision import BF16, FP32

    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["finetune"], "tasks": ["rte"], "seeds": [1]},
                      training={"epochs": 1, "batch_size": 8, "lr": 1e-3,
                                "mixed_precision": "auto"})
    results, cache = tmp_path / "results", tmp_path / "cache"

    def grid(precision: dict[str, str]) -> Grid:
        return Grid(load_suite(str(path)), results,
                    f"sqlite:///{results / 'optuna.db'}", cache, log=lambda _: None,
                    precision=precision)

    on_avx2, on_amx = grid(FP32), grid(BF16)
    assert on_avx2.runner.planner.run_id("finetune", "rte", 1) != on_amx.runner.planner.run_id(
        "finetune", "rte", 1)
    assert on_avx2.study_name == on_amx.study_name


def test_missing_cells_are_named_by_row_task_seed_and_status():
    from harness.experiments.grid import GridCell, PlannedCell

    def planned(method: str, task: str, seed: int, status: str,
                student: str | None = None) -> PlannedCell:
        return PlannedCell(GridCell(method, task, seed, student), "x" * 64, status, 3.0, 1,
                           None)

    grid = Grid.__new__(Grid)  # missing() reads only the planned cells it is given
    cells = [planned("kd", "rte", 1, "done"), planned("kd", "mrpc", 1, "todo"),
             planned("kd", "mrpc", 2, "failed"), planned("kd", "rte", 2, "todo", "3L-384"),
             planned("bilstm-soft", "cola", 3, "todo")]
    assert grid.missing(cells[:1]) is None
    assert grid.missing(cells) == (
        "4 of 5 grid cells have no finished run: kd x2 (mrpc; seeds 1, 2; failed/todo); "
        "kd [3L-384] x1 (rte; seeds 2; todo); bilstm-soft x1 (cola; seeds 3; todo)")


@pytest.mark.e2e
def test_the_table_command_a_grid_ends_with_reads_the_grids_store(tmp_path, tiny_data_dir,
                                                                    tiny_teacher_dir):
    """The grid ended with `table: harness table --suite S`, without the --results it wrote
    to: run as printed, it read the repository's store and found no records."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["finetune"], "tasks": ["rte"], "seeds": [1],
                       "budget": {"task_epochs": 1}})
    results, cache = tmp_path / "results", tmp_path / "cache"
    ran = CliRunner().invoke(app, ["grid", "--suite", str(path), "--results", str(results),
                                   "--cache-dir", str(cache)])
    assert ran.exit_code == 0, ran.output
    printed = ran.output.strip().splitlines()[-1].split("table: ", 1)[1]
    assert printed == f"harness table --suite {path} --grid --results {results}"
    table = CliRunner().invoke(app, printed.split()[1:])
    assert table.exit_code == 0, table.output
    assert "finetune" in table.output


@pytest.mark.e2e
def test_a_grid_run_with_set_is_tabled_and_reported_with_it(tmp_path, tiny_data_dir,
                                                              tiny_teacher_dir):
    """`harness table` and `harness report` had no --set: the cells of a grid run with one
    (other run ids) were planned without it, and shown missing."""
    import shlex

    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["finetune"], "tasks": ["rte"], "seeds": [1],
                       "budget": {"task_epochs": 1}})
    results, cache = tmp_path / "results", tmp_path / "cache"
    ran = CliRunner().invoke(app, ["grid", "--suite", str(path), "--set", "training.lr=2e-3",
                                   "--results", str(results), "--cache-dir", str(cache)])
    assert ran.exit_code == 0, ran.output
    printed = ran.output.strip().splitlines()[-1].split("table: ", 1)[1]
    assert printed == (f"harness table --suite {path} --grid --set training.lr=2e-3 "
                       f"--results {results}")
    table = CliRunner().invoke(app, shlex.split(printed)[1:])
    assert table.exit_code == 0 and "finetune" in table.output, table.output
    assert "no finished run" not in table.output, table.output
    without = CliRunner().invoke(app, ["table", "--suite", str(path), "--grid",
                                       "--results", str(results)])
    assert "1 of 1 grid cells have no finished run" in without.output, without.output
    out = tmp_path / "report"
    report = CliRunner().invoke(app, ["report", "--suite", str(path), "--grid", "--set",
                                      "training.lr=2e-3", "--results", str(results),
                                      "--out", str(out), "--no-figures",
                                      "--cache-dir", str(cache)])
    assert report.exit_code == 0, report.output
    assert "no finished run" not in report.output, report.output
    assert "--set training.lr=2e-3" in (out / "leaderboard.md").read_text()


@pytest.mark.e2e
def test_a_grid_over_a_max_steps_recipe_names_the_method_task_and_the_way_out(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """The refusal said only "stage 'task' is budgeted by max_steps": neither the method nor
    the task nor what to change."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["finetune"], "tasks": ["rte"], "seeds": [1],
                       "budget": {"task_epochs": 1}},
                      training={"max_steps": 3, "batch_size": 8, "lr": 1e-3})
    dry = CliRunner().invoke(app, ["grid", "--suite", str(path), "--dry-run",
                                   "--results", str(tmp_path / "results"),
                                   "--cache-dir", str(tmp_path / "cache")])
    assert dry.exit_code != 0
    assert "methods.finetune" in dry.output and "rte" in dry.output, dry.output
    assert "grid.budget.own_budget" in dry.output and "epochs" in dry.output, dry.output

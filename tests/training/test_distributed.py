"""Runs under `accelerate launch` with two CPU processes (DDP on gloo).

Every test starts a real two-process launch (``ACCELERATE_USE_CPU=1 accelerate launch
--multi_gpu --num_processes 2``: on a machine without GPUs this gives two CPU processes on
gloo; ``--cpu --num_processes 2`` would start one process without MPI), on the tiny suite
of the other tests.  A hang (processes out of step in a collective) fails by timeout.

This file is also the launched program of the tests that need more than the CLI:
``python -m tests.training.test_distributed train OUT`` and ``... tune SUITE RESULTS CACHE``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 240


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(tmp_path: Path, *args: str, module: str = "harness.cli"
                   ) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``python -m module args`` in two processes."""
    config = tmp_path / "accelerate.yaml"  # not the user's default accelerate config
    config.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
        "num_machines": 1, "num_processes": 2, "mixed_precision": "no", "use_cpu": False}))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1",
           "HARNESS_INFERENCE_SECONDS": "0", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(config), "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), "-m", module, *args]
    return command, env


def launch(tmp_path: Path, *args: str, module: str = "harness.cli",
           fails: bool = False) -> str:
    """Run ``python -m module args`` in two processes; its output (fails on an error, or
    with ``fails`` on its absence)."""
    command, env = launch_command(tmp_path, *args, module=module)
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"two-process launch still running after {TIMEOUT}s (processes out of "
                    f"step?):\n{error.stdout}\n{error.stderr}")
    output = done.stdout + done.stderr
    assert (done.returncode != 0) == fails, output[-6000:]
    return output


def records(root: Path) -> dict[Path, dict]:
    return {path: json.loads(path.read_text()) for path in sorted(root.glob("**/*.json"))}


# -- without a launch -------------------------------------------------------------------
def test_a_finished_cache_entry_is_kept_when_another_build_finishes(tmp_path):
    """Two builders of one entry (processes of a launch, workers sharing a cache): the
    first to finish puts its copy in place; the second drops its copy and leaves the
    finished entry alone (it may be being read)."""
    from harness.common.cache import ArtifactCache

    cache = ArtifactCache(tmp_path)
    with cache.build("teachers", "k" * 64, {"who": "second"}) as late:
        (late / "value.txt").write_text("second")
        with cache.build("teachers", "k" * 64, {"who": "first"}) as early:
            (early / "value.txt").write_text("first")
        assert cache.has("teachers", "k" * 64)
        inode = cache.path("teachers", "k" * 64).stat().st_ino
    entry = cache.path("teachers", "k" * 64)
    assert (entry / "value.txt").read_text() == "first"
    assert entry.stat().st_ino == inode
    assert [p.name for p in (tmp_path / "teachers").iterdir()] == ["k" * 64]  # no scratch

    (entry / "COMPLETE").unlink()  # a killed process's leftover is replaced
    with cache.build("teachers", "k" * 64, {}) as scratch:
        (scratch / "value.txt").write_text("rebuilt")
    assert (entry / "value.txt").read_text() == "rebuilt" and cache.has("teachers", "k" * 64)


@pytest.mark.e2e
def test_a_launch_accelerate_does_not_see_stops(tmp_path, tiny_suite_file, monkeypatch):
    """`accelerate launch --multi_gpu` on a machine without GPUs and without
    ACCELERATE_USE_CPU starts processes that each see one process: every one would run
    every cell.  The runner stops and says how to launch."""
    from harness.experiments.runner import SuiteRunner
    from harness.experiments.suites import load_suite

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="ACCELERATE_USE_CPU=1"):
        SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "results",
                    tmp_path / "cache")


# -- the training loop on two processes --------------------------------------------------
def _train(out: Path | None) -> dict:
    """Train a dropout-free tiny classifier (and a projection in ``extra``) for a few
    steps, then predict; the same arithmetic as one process on the whole batches."""
    from accelerate import Accelerator
    from transformers import BertConfig, BertForSequenceClassification

    from harness.api.losses import gold_loss
    from harness.api.method import LossTerm, Method, MethodParams, Stage, StepInputs
    from harness.api.students import classifier_config
    from harness.config.schema import TrainConfig
    from harness.data.features import EncodedSplit
    from harness.data.metrics import TaskEvaluator
    from harness.data.tasks import get_task
    from harness.teacher.outputs import TeacherRuntime
    from harness.training.engine import predict_logits, train_stage

    task = get_task("rte")

    class Objective(Method):
        name = "ddp-probe"
        loss_terms = (LossTerm("gold", "CE"), LossTerm("extra", "a projection's output"))

        def stages(self, task):
            return [Stage("task", ("gold", "extra"), teacher="none", teacher_outputs=frozenset())]

        def loss_gold(self, inputs: StepInputs) -> torch.Tensor:
            return gold_loss(inputs.student.logits, inputs.batch["labels"], False)

        def loss_extra(self, inputs: StepInputs) -> torch.Tensor:
            projection = getattr(inputs.extra, "module", inputs.extra)["projection"]
            return projection(inputs.student.logits).pow(2).mean()

    def split(name: str, rows: int, seed: int) -> EncodedSplit:
        rng = np.random.default_rng(seed)
        lengths = rng.integers(3, 12, rows)
        return EncodedSplit(name=name,
                            input_ids=[rng.integers(1, 50, n) for n in lengths],
                            token_type_ids=[np.zeros(n, dtype=np.int64) for n in lengths],
                            labels=rng.integers(0, 2, rows), lengths=lengths)

    accelerator = Accelerator()
    torch.manual_seed(1)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=32, max_position_embeddings=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    student = BertForSequenceClassification(classifier_config(config, task))
    extra = torch.nn.ModuleDict({"projection": torch.nn.Linear(2, 3)})
    objective = Objective(MethodParams(), {"gold": 1.0, "extra": 0.5})
    # 23 training rows in batches of 4: five full batches and one of 3, split 2 / 1
    # (losses weighted by share); 13 prediction rows: the last batch of one row leaves one
    # process nothing of it (it repeats the row, and its copy is dropped from the gather).
    result = train_stage(
        method=objective, stage=objective.stages(task)[0], student=student, extra=extra,
        config=TrainConfig(max_steps=8, batch_size=4, lr=1e-2, log_every_steps=1,
                           eval_every_steps=4, eval_batch_size=4, warmup_ratio=0.0),
        train_split=split("train", 23, 0), eval_split=split("dev", 11, 1),
        evaluator=TaskEvaluator(task), teacher=TeacherRuntime(), accelerator=accelerator,
        seed=3)
    student = accelerator.unwrap_model(student)
    logits = predict_logits(student, split("test", 13, 2), accelerator, 4)
    outcome = {"student": {k: v.detach().cpu().clone() for k, v in student.state_dict().items()},
               "extra": {k: v.detach().cpu().clone() for k, v in extra.state_dict().items()},
               "logits": logits, "history": result.history, "steps": result.steps,
               "examples_seen": result.examples_seen, "evaluations": result.evaluations,
               "processes": accelerator.num_processes}
    if out is not None:
        torch.save(outcome, out / f"process{accelerator.process_index}.pt")
    return outcome


@pytest.mark.e2e
def test_two_processes_train_like_one(tmp_path):
    """Same global batches, steps and schedule on two processes as on one; each process
    weighted by its share of a batch, so the weights (projections in ``extra`` included:
    DDP does not wrap them) and the gathered predictions match one process's."""
    launch(tmp_path, "train", str(tmp_path), module="tests.training.test_distributed")
    single = _train(None)
    assert single["processes"] == 1
    for index in (0, 1):
        double = torch.load(tmp_path / f"process{index}.pt", weights_only=False)
        assert double["processes"] == 2
        assert double["steps"] == single["steps"] == 8
        assert double["examples_seen"] == single["examples_seen"]
        assert [e["step"] for e in double["evaluations"]] == [4, 8]
        assert double["evaluations"] == single["evaluations"]
        for part in ("student", "extra"):
            assert double[part].keys() == single[part].keys()
            for name, value in single[part].items():
                torch.testing.assert_close(double[part][name], value, rtol=1e-4, atol=1e-5,
                                           msg=f"{part}.{name}")
        np.testing.assert_allclose(double["logits"], single["logits"], rtol=1e-4, atol=1e-5)
        for mine, theirs in zip(double["history"], single["history"], strict=True):
            assert mine["lr"] == pytest.approx(theirs["lr"])
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4, abs=1e-6)


# -- `harness run` --------------------------------------------------------------------------
@pytest.mark.e2e
def test_run_records_once_and_skips(tmp_path, tiny_suite_file):
    """kd (cached teacher logits) and tinybert (general distillation, a fitted masked-LM
    head, augmented copies labelled by the teacher, projections, a live teacher) on two
    processes: the teacher and every one-off asset built once, one record per run from
    the main process, and a second launch skips them on both processes."""
    results, cache = tmp_path / "results", tmp_path / "cache"
    args = ["run", "--suite", str(tiny_suite_file), "--method", "kd", "--method", "tinybert",
            "--tasks", "rte", "--results", str(results), "--cache-dir", str(cache)]
    launch(tmp_path, *args)
    first = records(results)
    assert sorted(record["method"] for record in first.values()) == ["kd", "tinybert"]
    for record in first.values():
        assert record["status"] == "finished"
        assert record["machine"]["num_processes"] == 2
        assert record["stages"] and all(stage["steps"] == 3 for stage in record["stages"])
    (teacher,) = [p for p in (cache / "teachers").iterdir() if not p.name.startswith(".")]
    assert json.loads((teacher / "summary.json").read_text())["processes"] == 2
    for kind in ("teachers", "general", "augmented", "augmented_logits", "mlm_head"):
        entries = [p for p in (cache / kind).iterdir() if not p.name.startswith(".")]
        assert len(entries) == 1 and (entries[0] / "COMPLETE").exists(), kind
        assert not [p for p in (cache / kind).iterdir() if p.name.startswith(".")], kind
    labels = np.load(next((cache / "augmented_logits").iterdir()) / "logits.npy")
    assert np.isfinite(labels).all() and len(labels) == 48  # one copy of each row, in order

    before = {path: path.read_bytes() for path in first}
    output = launch(tmp_path, *args)
    assert output.count("[skip]") == 2  # the main process logs; both skip
    assert "[run]" not in output
    assert {path: path.read_bytes() for path in records(results)} == before


@pytest.mark.e2e
def test_a_grid_whose_teacher_cannot_be_made_fails_its_cells_on_every_process(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """The task's teacher diverges on both processes: process 0 fails each of the task's
    cells in one line and goes on, and so must the others: one that raised the teacher's
    error would leave process 0 alone in the next cell's collective."""
    from tests.conftest import tiny_suite_dict

    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    suite["teacher"]["training"]["lr"] = 1.0e6
    suite["grid"] = {"methods": ["kd"], "tasks": ["rte"], "seeds": [1, 2]}
    suite_file = tmp_path / "grid-suite.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    output = launch(tmp_path, "grid", "--suite", str(suite_file), "--results",
                    str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache"),
                    "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", fails=True)
    for trial, seed in ((0, 1), (1, 2)):
        assert output.count(f"[grid] cell {trial} failed: kd / rte / seed {seed}: teacher: "
                            "the RTE teacher") == 1, output[-6000:]
    assert "0 of 2 cells complete, 2 failed" in output
    # Process 0 exits 1 for the failed cells (the launcher then prints its own traceback);
    # process 1 goes on to the next cell instead of stopping with the teacher's error.
    assert "error: the RTE teacher" not in output and "exitcode  : 2" not in output, \
        output[-6000:]
    assert "Connection closed" not in output
    assert not records(tmp_path / "results")


@pytest.mark.e2e
def test_one_ctrl_c_stops_every_process_of_a_launch_and_the_same_launch_resumes(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """A terminal's Ctrl-C reaches the launcher and both processes: each stops with the
    harness's one line (the launcher prints its own traceback), the stopped run has no
    record, and the same launch skips the recorded run and trains the stopped one once."""
    from tests.experiments.test_grid import default_sigint, grid_suite
    from tests.experiments.test_interrupt import _ctrl_c_once_training

    suite_file = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                            {"methods": ["kd"], "tasks": ["stsb"], "seeds": [1, 2]},
                            training={"epochs": 30, "batch_size": 8, "lr": 1e-3})
    results = tmp_path / "results"
    args = ["run", "--suite", str(suite_file), "--method", "kd", "--tasks", "stsb",
            "--seeds", "1,2", "--results", str(results), "--cache-dir", str(tmp_path / "cache")]
    command, env = launch_command(tmp_path, *args)
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           preexec_fn=default_sigint)
    output = _ctrl_c_once_training(job, "kd stsb s2 task", timeout=TIMEOUT)
    assert job.returncode != 0, output[-6000:]
    assert output.count("[run] interrupted (Ctrl-C): the run in progress is not recorded; "
                        "the same command skips the recorded runs and trains it "
                        "again") == 2, output[-6000:]
    # A Ctrl-C that lands in a callback Python runs on its own is printed as "Exception
    # ignored" and swallowed; the harness then stops at the next step, as the count says.
    assert "Connection closed" not in output and "error:" not in output, output[-6000:]
    [seed_1] = records(results).values()
    assert seed_1["seed"] == 1 and seed_1["status"] == "finished"

    again = launch(tmp_path, *args)
    assert again.count("[skip]") == 1 and "[done] kd stsb seed 2" in again, again[-6000:]
    assert sorted(record["seed"] for record in records(results).values()) == [1, 2]


# -- `harness tune` -------------------------------------------------------------------------
def _study(results: Path):
    import optuna

    (storage,) = results.glob("optuna.db")
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{storage}")
    return optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{storage}")


@pytest.mark.e2e
def test_tune_keeps_processes_on_one_trial(tmp_path, tiny_suite_file):
    """Process 0 asks Optuna, the other follows: every trial ran on both processes with
    the same parameters (the tuner checks a hash of them from every process and fails the
    trial otherwise), each trial wrote one record, and one parameter file came out."""
    results = tmp_path / "results"
    launch(tmp_path, "tune", "--suite", str(tiny_suite_file), "--method", "kd", "--task",
           "rte", "--trials", "3", "--results", str(results), "--cache-dir",
           str(tmp_path / "cache"))
    study = _study(results)
    trials = study.get_trials(deepcopy=False)
    assert [trial.state.name for trial in trials] == ["COMPLETE"] * 3
    assert all(trial.user_attrs["processes"] == 2 for trial in trials)
    runs = records(results / "tuning")
    assert len(runs) == 3
    assert sorted(run["tuning"]["trial"] for run in runs.values()) == [0, 1, 2]
    assert all(run["machine"]["num_processes"] == 2 for run in runs.values())
    assert len(list((results / "tuned").glob("*.yaml"))) == 1


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["grid", "tune"])
def test_an_unwritable_store_stops_every_process_with_its_message(tmp_path, tiny_data_dir,
                                                                  tiny_teacher_dir, command):
    """The records' folder is a file: both processes stop with the store's message, process
    0 not with an error about a peer that left first."""
    from tests.conftest import tiny_suite_dict

    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    suite["grid"] = {"methods": ["kd"], "tasks": ["rte"], "seeds": [1]}
    suite_file = tmp_path / "grid-suite.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    results = tmp_path / "results"
    blocked = results / ("tuning" if command == "tune" else "tiny")
    blocked.parent.mkdir()
    blocked.write_text("a file where the records' folder goes\n")
    target = ["--method", "kd", "--task", "rte", "--trials", "1"] if command == "tune" else []
    output = launch(tmp_path, command, "--suite", str(suite_file), *target, "--results",
                    str(results), "--cache-dir", str(tmp_path / "cache"),
                    "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", fails=True)
    assert output.count(f"error: results store {results}") == 2, output[-6000:]
    assert "Connection closed" not in output and "remote worker" not in output


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["run", "tune"])  # a grid plans on every process
def test_a_record_that_does_not_load_stops_every_process_with_its_message(
        tmp_path, tiny_data_dir, tiny_teacher_dir, command):
    """The run's record in the store is refused (edited after the run): only the main
    process reads it, so the others must hear why and stop alike, not wait in the
    collective for a record the main process never sends (or take the grid's or the
    study's stop for it and fail unpacking that)."""
    from typer.testing import CliRunner

    from harness.cli import app
    from tests.conftest import tiny_suite_dict

    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    suite["grid"] = {"methods": ["kd"], "tasks": ["rte"], "seeds": [1]}
    suite_file = tmp_path / "grid-suite.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    results, cache = tmp_path / "results", tmp_path / "cache"
    target = {"run": ["--method", "kd", "--tasks", "rte", "--seeds", "1"],
              "tune": ["--method", "kd", "--task", "rte", "--trials", "1"]}[command]
    args = [command, "--suite", str(suite_file), *target, "--results", str(results),
            "--cache-dir", str(cache)]

    def storage(name: str) -> list[str]:  # a study of its own for each tune
        return [] if command == "run" else ["--storage", f"sqlite:///{tmp_path / name}"]

    done = CliRunner().invoke(app, [*args, *storage("first.db")])
    assert done.exit_code == 0, done.output
    (record,) = results.glob("**/kd/rte/*.json")
    document = json.loads(record.read_text())
    document["seed"] = 5
    record.write_text(json.dumps(document))
    output = launch(tmp_path, *args, *storage("second.db"), fails=True)
    assert output.count(f"error: {record}: not a valid run record") == 2, output[-6000:]
    assert "unpack" not in output and "Connection closed" not in output, output[-6000:]


def _tune(suite: str, results: str, cache: str) -> None:
    """Three trials with a pruner that stops trial 1 at its first evaluation."""
    import atexit

    import optuna
    import torch.distributed as dist

    # Registered before the runner's own exit handler, so it runs after it (last in, first
    # out): it reports whether the process group was left to the interpreter's teardown.
    atexit.register(lambda: print(f"process {os.environ['RANK']} group at exit: "
                                  f"{dist.is_initialized()}", flush=True))

    from harness.experiments.storage import default_storage
    from harness.experiments.suites import load_suite
    from harness.experiments.tuning import Tuner, TuningTarget

    class PruneTrialOne(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            return trial.number == 1

    class Pruning(Tuner):
        def study(self):
            study = super().study()
            study.pruner = PruneTrialOne()
            return study

    config = load_suite(suite)
    tuner = Pruning(config, TuningTarget("kd", "rte", [1]), Path(results),
                    default_storage(Path(results)), Path(cache), log=lambda _: None)
    tuner.optimize(3)
    accelerator = tuner.runner.accelerator
    print(f"process {accelerator.process_index} done", flush=True)


@pytest.mark.e2e
def test_pruning_stops_every_process(tmp_path, tiny_suite_file):
    """A pruning decision (process 0's, from Optuna) stops the trial on both processes,
    and both go on to the next trial."""
    results = tmp_path / "results"
    output = launch(tmp_path, "tune", str(tiny_suite_file), str(results),
                    str(tmp_path / "cache"), module="tests.training.test_distributed")
    assert "process 0 done" in output and "process 1 done" in output
    # Each process destroyed its process group before the interpreter's teardown.
    assert "process 0 group at exit: False" in output
    assert "process 1 group at exit: False" in output
    trials = _study(results).get_trials(deepcopy=False)
    assert [trial.state.name for trial in trials] == ["COMPLETE", "PRUNED", "COMPLETE"]
    assert len(trials[1].intermediate_values) == 1
    assert len(records(results / "tuning")) == 2  # a pruned run leaves no record


if __name__ == "__main__":
    if sys.argv[1] == "train":
        _train(Path(sys.argv[2]))
    elif sys.argv[1] == "tune":
        _tune(*sys.argv[2:5])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")

"""Experiment trackers (``--log-with``): a real tiny run logged to TensorBoard and its event
files read back against the run's record; the grid's and tuning's runs get tracker runs of
their own; an unknown tracker or a missing package is an error before anything runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from typer.testing import CliRunner

from harness.cli import app
from tests.conftest import tiny_suite_dict
from tests.experiments.test_grid import grid_suite

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def _events(folder: Path) -> EventAccumulator:
    """Every scalar of the event files directly in ``folder`` (none sampled away)."""
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    return accumulator


def _hparams(run_dir: Path) -> dict[str, object]:
    """The hyper-parameters TensorBoard's HParams dashboard shows for a run: the session
    start info that ``add_hparams`` writes to a folder of its own inside the run's."""
    found = {}
    for events in run_dir.glob("*/events.out.tfevents.*"):
        accumulator = _events(events.parent)
        content = accumulator.PluginTagToContent("hparams").get("_hparams_/session_start_info")
        if content is None:
            continue
        info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
        for key, value in info.hparams.items():
            found[key] = value.string_value if value.HasField("string_value") \
                else value.number_value
    return found


def _scalars(accumulator: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def _files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


@pytest.mark.e2e
def test_a_run_logs_each_stage_loss_terms_lr_and_evaluations_to_tensorboard(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    # TinyBERT without augmentation: a general (corpus) stage, then two task stages, the
    # second evaluated on dev every 2 steps; one step axis runs across the three.
    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir, steps=4)
    suite["methods"]["tinybert"]["params"]["augment"] = False
    suite["training"]["eval_every_steps"] = 2
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    results, cache, runs = tmp_path / "results", tmp_path / "cache", tmp_path / "runs"
    command = ["run", "--suite", str(path), "--method", "tinybert", "--tasks", "rte",
               "--seeds", "1", "--results", str(results), "--cache-dir", str(cache),
               "--log-with", "tensorboard", "--log-dir", str(runs)]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output

    [record_path] = results.glob("**/*.json")
    record = json.loads(record_path.read_text())
    name = record_path.relative_to(results).with_suffix("").as_posix()
    assert name == f"tiny/tinybert/rte/tiny-seed1-{record['run_id'][:16]}"
    run_dir = runs / name
    assert f"[track] tensorboard: {name}" in result.output
    events = _events(run_dir)

    general = json.loads((cache / "general" / record["general_distillation"]["key"]
                          / "summary.json").read_text())["stages"]
    stages = [*general, *record["stages"]]
    assert [stage["name"] for stage in stages] == ["general", "intermediate", "prediction"]
    expected_tags = set()
    offset = 0
    for stage in stages:
        name_ = stage["name"]
        history = stage["history"]
        assert [entry["step"] for entry in history] == [1, 2, 3, 4]  # log_every_steps 1
        terms = [key for key in history[0] if key not in {"step", "epoch", "lr", "loss"}]
        assert terms  # general and intermediate: embedding, attention, hidden
        for key, tag in [*((term, f"{name_}/loss/{term}") for term in terms),
                         ("loss", f"{name_}/loss/total"), ("lr", f"{name_}/lr"),
                         ("epoch", f"{name_}/epoch")]:
            logged = _scalars(events, tag)
            assert [step for step, _ in logged] == [offset + h["step"] for h in history], tag
            assert [value for _, value in logged] == pytest.approx(
                [h[key] for h in history], rel=1e-6), tag
            expected_tags.add(tag)
        for evaluation in stage.get("evaluations", []):
            for metric, value in evaluation.items():
                if metric in {"step", "epoch"}:
                    continue
                tag = f"{name_}/dev/{metric}"
                assert (offset + evaluation["step"], pytest.approx(value, rel=1e-6)) \
                    in _scalars(events, tag), tag
                expected_tags.add(tag)
        offset += stage["steps"]
    evaluations = record["stages"][-1]["evaluations"]
    assert [evaluation["step"] for evaluation in evaluations] == [2, 4]
    assert {"prediction/dev/accuracy"} <= expected_tags
    for split, metrics in record["dev"].items():
        for metric, value in metrics.items():
            tag = f"final/{split}/{metric}"
            assert _scalars(events, tag) == [(offset, pytest.approx(value, rel=1e-6))]
            expected_tags.add(tag)
    assert _scalars(events, "final/pct_of_teacher") == [
        (offset, pytest.approx(record["pct_of_teacher"], rel=1e-6))]
    expected_tags.add("final/pct_of_teacher")
    assert set(events.Tags()["scalars"]) == expected_tags  # and nothing else

    hparams = _hparams(run_dir)
    assert hparams["run_id"] == record["run_id"]
    assert hparams["tracker_run"] == name
    assert hparams["method"] == "tinybert" and hparams["task"] == "rte"
    assert hparams["seed"] == 1 and hparams["config.seed"] == 1
    assert hparams["config.params.augment"] == 0  # booleans are numbers in TensorBoard
    assert hparams["config.stages.prediction.max_steps"] == 4
    assert hparams["config.general.key"] == record["config"]["general"]["key"]
    [saved] = run_dir.glob("*/hparams.yml")  # accelerate's copy of the same values
    assert yaml.safe_load(saved.read_text())["run_id"] == record["run_id"]

    # The store has the run now: the same command skips it and logs nothing.
    before = _files(runs)
    again = CliRunner().invoke(app, command)
    assert again.exit_code == 0, again.output
    assert "skipped" in again.output and "[track]" not in again.output
    assert _files(runs) == before


@pytest.mark.e2e
def test_a_failed_run_keeps_its_curves_and_its_retry_logs_apart(tmp_path, tiny_suite_file):
    results, runs = tmp_path / "results", tmp_path / "runs"
    command = ["run", "--suite", str(tiny_suite_file), "--method", "finetune", "--tasks",
               "rte", "--seeds", "1", "--results", str(results), "--cache-dir",
               str(tmp_path / "cache"), "--log-with", "tensorboard", "--log-dir", str(runs),
               "--set", "training.lr=1.0e+30", "--set", "training.max_steps=20",
               "--set", "training.max_grad_norm=null"]
    assert CliRunner().invoke(app, command).exit_code == 1  # the loss diverged
    [record_path] = results.glob("**/*.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "failed"
    name = record_path.relative_to(results).with_suffix("").as_posix()
    # every step before the non-finite loss was logged
    steps = [step for step, _ in _scalars(_events(runs / name), "task/loss/total")]
    assert steps and steps == list(range(1, record["failure"]["step"] + 1))

    retried = CliRunner().invoke(app, [*command, "--retry-failed"])
    assert retried.exit_code == 1
    assert f"[track] tensorboard: {name}-attempt2" in retried.output
    assert [step for step, _ in _scalars(_events(runs / f"{name}-attempt2"),
                                         "task/loss/total")] == steps


@pytest.mark.e2e
def test_grid_and_its_tuning_trials_log_a_tracker_run_each(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["kd"], "tasks": ["rte"], "seeds": [1],
                       "budget": {"task_epochs": 1, "tuning_trials": 1,
                                  "tuning_seeds": [1]}})
    results, runs = tmp_path / "results", tmp_path / "runs"
    result = CliRunner().invoke(app, [
        "grid", "--suite", str(path), "--results", str(results), "--cache-dir",
        str(tmp_path / "cache"), "--log-with", "tensorboard,tensorboard"])
    assert result.exit_code == 0, result.output
    # --log-dir's default: runs/ beside the results store, each tracker run where its
    # record lies in the store.
    tracked = {folder.relative_to(runs).as_posix()
               for folder in runs.glob("**/*-seed1-*") if folder.is_dir()}
    records = {record.relative_to(results).with_suffix("").as_posix()
               for record in results.glob("**/*-seed1-*.json")}
    assert tracked == records and len(records) == 2
    [trial] = [name for name in tracked if name.startswith("tuning/")]
    [cell] = [name for name in tracked if not name.startswith("tuning/")]
    assert trial.split("/")[2:4] == ["tiny", "kd"]
    trial_params = _hparams(runs / trial)
    assert trial_params["tuning.study"] == trial.split("/")[1]
    assert trial_params["tuning.trial"] == 0
    cell_params = _hparams(runs / cell)
    assert cell_params["grid.study"].startswith("grid-tiny-")
    assert cell_params["variation.task_epochs"] == 1
    assert _scalars(_events(runs / cell), "task/dev/accuracy")


@pytest.mark.e2e
@pytest.mark.parametrize("command", [
    ["run"], ["grid"], ["tune", "--method", "kd", "--task", "rte"],
    ["worker", "--storage", "sqlite:///unused.db"]], ids=["run", "grid", "tune", "worker"])
def test_an_unknown_tracker_is_refused_before_anything_runs(tmp_path, tiny_suite_file,
                                                            command):
    result = CliRunner().invoke(app, [*command, "--suite", str(tiny_suite_file), "--results",
                                      str(tmp_path / "results"), "--log-with",
                                      "tensorboard,tensorbord"])
    assert result.exit_code == 2
    assert ("--log-with tensorbord: unknown tracker; choose tensorboard, wandb, mlflow, aim"
            in result.output)
    assert not (tmp_path / "results").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("backend, modules, install", [
    ("tensorboard", ["tensorboard", "tensorboardX"], "pip install tensorboard"),
    ("wandb", ["wandb"], "pip install wandb"),
    ("mlflow", ["mlflow"], "pip install mlflow"),
    ("aim", ["aim"], "pip install 'aim<4'")], ids=["tensorboard", "wandb", "mlflow", "aim"])
def test_a_tracker_whose_package_is_missing_says_what_to_install(
        tmp_path, tiny_suite_file, monkeypatch, backend, modules, install):
    for module in modules:  # not importable, as on a machine without the package
        monkeypatch.setitem(sys.modules, module, None)
    result = CliRunner().invoke(app, ["run", "--suite", str(tiny_suite_file), "--results",
                                      str(tmp_path / "results"), "--log-with", backend])
    assert result.exit_code == 2
    assert f"--log-with {backend}: the {backend} package is not installed (`{install}`)" \
        in result.output
    assert not (tmp_path / "results").exists()

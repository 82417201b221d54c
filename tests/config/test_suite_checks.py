"""Every recipe of a suite is checked against its plugin when the suite loads, before
anything runs (``--dry-run`` included): params, per-task params, loss terms, stage names,
student kinds and schemas, ``base:``, ``default_method`` and the grid's methods.  Errors
name the suite file and the key path where the mistake was written, and stay short."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config.schema import ConfigError
from harness.experiments.suites import load_suite
from tests.config.test_config import BASE_SUITE


def suite_file(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    tree = yaml.safe_load(BASE_SUITE)
    tree["tasks"] = ["sst2", "mrpc", "cola"]
    tree["students"]["words"] = {"kind": "bilstm", "hidden_size": 8}
    tree["methods"].update({
        "bert-pkd": {"params": {"mapping": "skip"}},
        "bert-pkd-last": {"base": "bert-pkd", "params": {"mapping": "last"}},
        "tinybert": {"task_params": {"cola": {"augmentation": {"copies": 2}}}},
        "bilstm-soft": {"student": "words"},
    })
    tree["grid"] = {"methods": ["kd", "finetune"], "variants": ["bert-pkd-last"]}
    edit(tree)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def load_error(path: Path) -> list[str]:
    """The error's lines: the file first, then one line per problem."""
    with pytest.raises(ConfigError) as info:
        load_suite(str(path))
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}: invalid recipe", lines
    return [line.strip() for line in lines[1:]]


def test_the_fixture_loads(tmp_path: Path) -> None:
    suite = load_suite(str(suite_file(tmp_path, lambda tree: None)))
    assert suite.recipe("bert-pkd-last").params == {"mapping": "last"}


@pytest.mark.parametrize(("edit", "expected"), [
    # a variant's own typo is named at the variant, not at its base
    (lambda t: t["methods"]["bert-pkd-last"]["params"].update(mappping="last"),
     ["methods.bert-pkd-last.params.mappping: unknown parameter"]),
    # a bad value inherited from the base is named at the base
    (lambda t: t["methods"]["bert-pkd"]["params"].update(beta="lots"),
     ["methods.bert-pkd.params.beta: Input should be a valid number"]),
    (lambda t: t["methods"]["bert-pkd-last"].update(base="bert-pdk"),
     ["methods.bert-pkd-last.base: unknown method 'bert-pdk'"]),
    (lambda t: t["methods"]["kd"].update(disabled_losses=["soft", "cee"]),
     ["methods.kd.disabled_losses.1: kd has no loss term 'cee'"]),
    (lambda t: t["methods"]["kd"].update(loss_weights={"sfot": 0.5}),
     ["methods.kd.loss_weights.sfot: kd has no loss term 'sfot'"]),
    (lambda t: t["methods"]["kd"].update(stages={"tsak": {"lr": 1e-4}}),
     ["methods.kd.stages.tsak: kd has no stage 'tsak'"]),
    (lambda t: t["methods"]["tinybert"].update(task_stages={"cola": {"intermediat": {
        "epochs": 2}}}), ["methods.tinybert.task_stages.cola.intermediat: tinybert has no "
                          "stage 'intermediat'"]),
    (lambda t: t["methods"]["tinybert"]["task_params"]["cola"]["augmentation"].update(
        copiez=3), ["methods.tinybert.task_params.cola.augmentation.copiez: unknown "
                     "parameter"]),
    (lambda t: t.update(default_method="kdd"), ["default_method: unknown method 'kdd'"]),
    (lambda t: t["grid"].update(methods=["kd", "finetuen"]),
     ["grid.methods: unknown method 'finetuen'"]),
    (lambda t: t["students"]["words"].update(hidden_sise=3),
     ["students.words.hidden_sise: unknown key"]),
    (lambda t: t["students"]["words"].update(kind="lstm"),
     ["students.words.kind: unknown student kind 'lstm'"]),
    (lambda t: t["methods"]["kd"].update(student="words"),
     ["methods.kd.student: 'words' is a bilstm student; kd builds bert students"]),
    (lambda t: t["methods"].update(unknown={}), ["methods.unknown: unknown method 'unknown'"]),
])
def test_a_mistake_in_any_recipe_is_named_where_it_was_written(
        tmp_path: Path, edit: Callable[[dict[str, Any]], None], expected: list[str]) -> None:
    problems = load_error(suite_file(tmp_path, edit))
    assert len(problems) == len(expected), problems
    for line, start in zip(problems, expected, strict=True):
        assert line.startswith(start), (line, start)


def test_every_mistake_is_listed_at_once(tmp_path: Path) -> None:
    def edit(tree: dict[str, Any]) -> None:
        tree["methods"]["kd"]["disabled_losses"] = ["cee"]
        tree["methods"]["bert-pkd-last"]["params"]["mappping"] = "last"
        tree["default_method"] = "kdd"

    problems = load_error(suite_file(tmp_path, edit))
    assert [line.split(":")[0] for line in problems] == [
        "methods.kd.disabled_losses.0", "methods.bert-pkd-last.params.mappping",
        "default_method"]


def test_an_unknown_task_is_a_short_error(tmp_path: Path) -> None:
    path = suite_file(tmp_path, lambda tree: tree.update(tasks=["sst2", "mrcp"]))
    with pytest.raises(ConfigError) as info:
        load_suite(str(path))
    message = str(info.value)
    assert message.splitlines()[1].strip().startswith("tasks.1: Value error, unknown task "
                                                      "'mrcp'"), message
    assert str(path) in message and len(message) < 400, message


@pytest.mark.e2e
def test_cli_names_an_unknown_method_and_dry_run_checks_recipes(tmp_path: Path) -> None:
    path = suite_file(tmp_path, lambda tree: None)
    runner = CliRunner()
    result = runner.invoke(app, ["run", "--suite", str(path), "--method", "kdd"])
    assert result.exit_code != 0
    assert f"{path}: --method: unknown method 'kdd'; did you mean 'kd'?" in result.output
    bad = suite_file(tmp_path, lambda t: t["methods"]["bert-pkd-last"]["params"].update(
        mappping="last"))
    result = runner.invoke(app, ["grid", "--suite", str(bad), "--dry-run",
                                 "--results", str(tmp_path / "results")])
    assert result.exit_code != 0
    assert "methods.bert-pkd-last.params.mappping: unknown parameter" in result.output
    assert not (tmp_path / "results").exists()

"""A record names the code that made it; a run whose plugin changed since is trained again and
left out of reports; a method says which tasks and terms apply to it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.api.registry import registry
from harness.cli import app
from harness.experiments.planner import NotApplicableError, current_records
from harness.experiments.provenance import (
    code_change,
    core_digest,
    file_digest,
    general_cache_key,
    plugin_digest,
    run_code,
)
from harness.experiments.runner import SuiteRunner
from harness.experiments.store import ResultsStore
from harness.experiments.suites import load_suite

REPO = Path(__file__).resolve().parents[2]


def _skeleton(tmp_path: Path, name: str) -> Path:
    result = CliRunner().invoke(app, ["new-method", name, "--directory", str(tmp_path)])
    assert result.exit_code == 0, result.output
    return tmp_path / f"{name.replace('-', '_')}.py"


def _load(path: Path, name: str) -> None:
    """(Re)load the plugin at ``path``: its class replaces the registered one."""
    registry._methods.pop(name, None)
    spec = importlib.util.spec_from_file_location(f"{path.stem}_plugin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def test_a_digest_follows_the_code_not_its_comments_docstrings_or_layout(tmp_path):
    source = tmp_path / "plugin.py"
    source.write_text('"""Doc."""\n\ndef loss(x):\n    """Its doc."""\n    return x * 2\n')
    first = file_digest(source)
    source.write_text('"""Other doc."""\n# a comment\n\ndef loss( x ):\n    return (x * 2)\n')
    assert file_digest(source) == first
    source.write_text('"""Doc."""\n\ndef loss(x):\n    return x * 3\n')
    assert file_digest(source) != first


def test_every_builtin_plugin_has_a_digest_of_its_own_and_a_package_counts_whole():
    digests = {name: plugin_digest(name) for name in
               ("kd", "finetune", "tinybert", "bilstm-soft", "minilm", "distilbert",
                "bert-pkd")}
    assert len(set(digests.values())) == len(digests)
    code = run_code(["kd", "tinybert"])
    assert code == {"plugins": {"kd": digests["kd"], "tinybert": digests["tinybert"]},
                    "core": core_digest()}
    assert code_change(code, code) is None
    assert code_change(None, code) is None  # a record from before digests: kept as it is
    changed = {**code, "plugins": {**code["plugins"], "kd": "0" * 64}}
    assert "plugin kd's code" in code_change(changed, code)


def test_committed_records_name_the_code_of_this_checkout():
    """The shipped records are results of the shipped plugins and core: none is stale."""
    records = list(ResultsStore(REPO / "results").records())
    assert records
    codes: dict[tuple[str, ...], dict] = {}
    for record in records:
        assert record.code is not None, record.run_id
        plugins = tuple(sorted(record.code["plugins"]))
        if plugins not in codes:
            codes[plugins] = run_code(plugins)
        assert code_change(record.code, codes[plugins]) is None, (record.method, record.task)


@pytest.mark.e2e
def test_a_run_whose_plugin_changed_is_trained_again_and_left_out_of_reports(
        tiny_suite_file, tmp_path):
    path = _skeleton(tmp_path, "my-stale")
    logged: list[str] = []
    try:
        _load(path, "my-stale")
        runner = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "results",
                             tmp_path / "cache", log=logged.append)
        first = runner.run_one("my-stale", "rte", seed=1)
        assert first.status == "finished"
        assert first.record.code == run_code(["my-stale"])
        _edit(path, "# GOLD's loss", "# The gold term's loss")  # a comment: same code
        _load(path, "my-stale")
        assert runner.run_one("my-stale", "rte", seed=1).status == "skipped"

        _edit(path, "self.params.temperature)", "self.params.temperature * 2)")
        _load(path, "my-stale")
        suite = load_suite(str(tiny_suite_file))
        report_log: list[str] = []
        stored = list(ResultsStore(tmp_path / "results").records())
        assert current_records(suite, stored, report_log.append) == []
        assert any("stale" in line for line in report_log)
        assert any("plugin my-stale's code" in line for line in report_log)

        again = runner.run_one("my-stale", "rte", seed=1)
        assert again.status == "finished" and again.path == first.path
        assert any(line.startswith("[stale] my-stale rte seed 1") for line in logged)
        assert again.record.code != first.record.code
        assert json.loads(first.path.read_text())["code"] == again.record.code
        assert current_records(suite, ResultsStore(tmp_path / "results").records(),
                               report_log.append) == [again.record]
    finally:
        registry._methods.pop("my-stale", None)


@pytest.mark.e2e
def test_the_general_checkpoint_is_keyed_by_the_code_that_distils_it(tmp_path):
    path = _skeleton(tmp_path, "my-general")
    try:
        _load(path, "my-general")
        first = general_cache_key("k" * 64, registry.get("my-general"))
        assert general_cache_key("k" * 64, registry.get("my-general")) == first
        _edit(path, "self.params.temperature)", "self.params.temperature + 1)")
        _load(path, "my-general")
        assert general_cache_key("k" * 64, registry.get("my-general")) != first
    finally:
        registry._methods.pop("my-general", None)


APPLICABILITY = '''
    def task_problem(self, task: TaskSpec) -> str | None:
        return "no classes to distil" if task.is_regression else None

    def inactive_terms(self, task: TaskSpec) -> frozenset[str]:
        return frozenset({"distill"}) if task.num_labels == 2 else frozenset()

    def search_space('''


@pytest.mark.e2e
def test_a_method_leaves_out_tasks_and_terms_that_do_not_apply(tiny_suite_file, tmp_path):
    path = _skeleton(tmp_path, "my-classes")
    _edit(path, "\n    def search_space(", APPLICABILITY)
    logged: list[str] = []
    try:
        _load(path, "my-classes")
        runner = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "results",
                             tmp_path / "cache", log=logged.append)
        with pytest.raises(NotApplicableError, match="does not apply to stsb: no classes"):
            runner.planner.resolve("my-classes", "stsb", 1)
        outcomes = runner.run(["my-classes"], ["rte", "stsb"], [1])
        assert [(outcome.task, outcome.status) for outcome in outcomes] == [
            ("rte", "finished")]
        assert any(line.startswith("[n/a] my-classes on stsb: no classes to distil")
                   for line in logged)
        record = outcomes[0].record
        assert record.config["loss_weights"] == {"gold": 0.5}
        assert [stage.terms for stage in record.stages] == [{"gold": 0.5}]
        assert set(record.stages[0].final_losses) == {"gold", "total"}
        assert not list((tmp_path / "results").glob("**/stsb/*.json"))
    finally:
        registry._methods.pop("my-classes", None)

"""The Python API (harness.python_api): runs started from it are the command line's runs, a
store reads as records and as one table, and the README's examples run."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from harness import load_records, records_frame, run
from harness.cli import app
from harness.experiments.record import RunRecord
from harness.experiments.suites import load_suite
from harness.reporting.tables import finished_records, score_table
from tests.conftest import tiny_suite_dict

REPO = Path(__file__).resolve().parent.parent
DIVERGING = {"training.lr": 1e30, "training.max_steps": 20, "training.max_grad_norm": None}
"""A finetune run whose loss becomes infinite: recorded as failed (as in test_runner)."""


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_data_dir, tiny_teacher_dir) -> dict[str, Any]:
    """kd and finetune on RTE (seed 1) and a failed finetune run, through :func:`run`, into
    one store and cache the module's tests share (they read it, and add nothing to it)."""
    root = tmp_path_factory.mktemp("notebook")
    suite = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    suite["methods"]["kd-3L"] = {"base": "kd", "student": "tiny-wide"}  # the README's method
    suite_file = root / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    paths = {"suite": suite_file, "results": root / "results", "cache": root / "cache"}
    common = {"suite": suite_file, "results": paths["results"], "cache_dir": paths["cache"],
              "log": None}
    finished = run(["kd", "finetune"], tasks="rte", seeds=1, **common)
    failed = run("finetune", tasks="rte", seeds=[1], overrides=DIVERGING, **common)
    return {**paths, "finished": finished, "failed": failed}


def _cli_run(store: dict[str, Any], results: Path) -> str:
    result = CliRunner().invoke(app, [
        "run", "--suite", str(store["suite"]), "--method", "kd", "--method", "finetune",
        "--tasks", "rte", "--seeds", "1", "--results", str(results),
        "--cache-dir", str(store["cache"])])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.e2e
def test_run_returns_the_records_the_command_line_writes_and_trains_nothing_twice(
        store, tmp_path):
    records = store["finished"]
    assert [(r.method, r.task, r.seed, r.status) for r in records] == [
        ("kd", "rte", 1, "finished"), ("finetune", "rte", 1, "finished")]
    written = {path.relative_to(store["results"]): path.read_bytes()
               for path in store["results"].glob("**/*.json")}
    assert len(written) == 3  # and the failed run's

    # `harness run` into a new store: the same runs (ids, places in the store, scores)
    cli = tmp_path / "cli"
    _cli_run(store, cli)
    by_cli = {record.run_id: record for record in load_records(cli)}
    assert set(by_cli) == {record.run_id for record in records}
    for record in records:
        twin = by_cli[record.run_id]
        assert twin.config == record.config and twin.main_score == record.main_score
    assert sorted(path.relative_to(cli) for path in cli.glob("**/*.json")) == sorted(
        path for path in written
        if any(path.name.endswith(f"-{record.run_id[:16]}.json") for record in records))

    # again through the API: the stored records come back, nothing is trained or rewritten
    lines: list[str] = []
    again = run(["kd", "finetune"], suite=store["suite"], tasks=["rte"], seeds="1",
                results=store["results"], cache_dir=store["cache"], log=lines.append)
    assert again == records  # started_at and every result included
    assert sum(line.startswith("[skip]") for line in lines) == 2
    assert not any(line.startswith("[run]") for line in lines)
    assert {path.relative_to(store["results"]): path.read_bytes()
            for path in store["results"].glob("**/*.json")} == written

    # and the command line on the API's store finds them too
    output = _cli_run(store, store["results"])
    assert len(re.findall(r"^(kd|finetune)\s+rte\s+1 skipped", output, re.M)) == 2


def _leaves(tree: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.slow
def test_records_frame_has_one_row_per_run_with_results_and_config_flattened(store):
    records = [*store["finished"], *store["failed"]]
    frame = records_frame(store["results"], suite="tiny")
    assert len(frame) == 3 and sorted(frame["run_id"]) == sorted(r.run_id for r in records)
    assert list(frame.columns[:12]) == [
        "run_id", "suite", "method", "label", "task", "seed", "student_shape", "status",
        "main_metric", "main_score", "teacher_main_score", "pct_of_teacher"]
    rows = frame.set_index("run_id")
    for record in records:
        row = rows.loc[record.run_id]
        assert (row["suite"], row["method"], row["label"], row["task"], row["seed"],
                row["student_shape"], row["status"], row["main_metric"]) == (
            "tiny", record.method, record.method, "rte", 1, record.student_shape,
            record.status, "accuracy")
        assert row["data.fingerprint"] == record.data.fingerprint
        assert row["started_at"] == record.started_at
        assert row["config.stages.task.lr"] == record.config["stages"]["task"]["lr"]
        for column, value in _leaves(record.config, "config."):
            if value is None or value == {}:
                assert column not in rows or pd.isna(row[column]), column
            else:
                assert row[column] == value, column
        if record.finished:
            assert row["main_score"] == record.main_score
            assert row["dev.accuracy"] == record.dev["dev"]["accuracy"]
            assert row["teacher_main_score"] == record.teacher_main_score
            assert row["pct_of_teacher"] == record.pct_of_teacher
            assert row["parameters.total"] == record.parameters.total
            assert row["parameters.non_embedding"] == record.parameters.non_embedding
            assert row["train_seconds"] == record.train_seconds
            assert row["inference.speedup"] == record.inference["speedup"]
            assert pd.isna(row["error"])
        else:
            assert pd.isna(row["main_score"]) and pd.isna(row["dev.accuracy"])
            assert pd.isna(row["parameters.total"])
            assert "non-finite loss" in row["error"]
    failed = rows.loc[store["failed"][0].run_id]
    assert failed["config.stages.task.lr"] == 1e30 and failed["config.stages.task.max_steps"] == 20

    # the same table from the records themselves, and from the whole store
    pd.testing.assert_frame_equal(records_frame(load_records(store["results"], "tiny")), frame)
    pd.testing.assert_frame_equal(records_frame(store["results"]), frame)
    assert records_frame(records, suite="other").empty
    assert list(records_frame([]).columns[:12]) == list(frame.columns[:12])
    with pytest.raises(FileNotFoundError, match=r"suite 'tinny'.*suites with records: tiny"):
        records_frame(store["results"], suite="tinny")


def _python_blocks(markdown: str, section: str) -> list[str]:
    """The ```python blocks of one ``## section`` of a Markdown file."""
    body = markdown.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```", body, re.M | re.S)


def _exec(code: str) -> tuple[dict[str, Any], str]:
    namespace: dict[str, Any] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), namespace)
    return namespace, printed.getvalue()


@pytest.mark.slow
def test_readme_python_api_examples_run(store, tmp_path, monkeypatch):
    reading, running = _python_blocks((REPO / "README.md").read_text(), "Python API")

    # as written: the committed store, whose table is the one `harness table` computes
    monkeypatch.chdir(REPO)
    namespace, printed = _exec(reading)
    runs = namespace["runs"]
    assert len(runs) == len(list((REPO / "results" / "glue-cpu").glob("**/*.json")))
    suite = load_suite("glue-cpu")
    expected = finished_records(suite, REPO / "results")
    expected = expected[expected["seed"].isin(suite.seeds)]  # as `harness table` reads them
    table = score_table(expected, sorted(set(expected["task"])))
    shown = namespace["scores"]
    for label, task in expected.groupby(["method", "task"]).groups:
        assert shown.loc[label, task] == pytest.approx(table.loc[label, task], abs=0.005)
        assert label in printed

    # the run on the tiny suite and task instead of glue-cpu's MRPC, in a scratch folder
    for real, tiny in (('suite="glue-cpu"', f'suite="{store["suite"]}"'),
                       ('tasks="mrpc"', 'tasks="rte"')):
        assert running.count(real) == 1, real
        running = running.replace(real, tiny)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(store["cache"]))
    namespace, printed = _exec(running)
    records: list[RunRecord] = namespace["records"]
    assert [(r.method, r.task, r.seed, r.status) for r in records] == [
        ("kd-3L", "rte", 1, "finished")]
    assert records[0].config["stages"]["task"]["max_steps"] == 20
    assert load_records(tmp_path / "scratch") == records
    assert records[0].run_id[:16] in printed


@pytest.mark.parametrize(("arguments", "message"), [
    ({"tasks": "sst3"}, "tasks: unknown task 'sst3'"),
    ({"tasks": "rte", "seeds": "1,x"}, "seeds: 'x' is not a seed"),
])
def test_a_mistaken_task_or_seed_is_a_config_error_before_anything_runs(arguments, message,
                                                                         tmp_path):
    from harness.config.schema import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        run("kd", results=tmp_path / "results", log=None, **arguments)
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_log_none_draws_no_progress_bar_where_a_logged_run_draws_them(store, tmp_path, capfd):
    common = {"suite": store["suite"], "cache_dir": store["cache"], "tasks": "rte", "seeds": 2}
    run("finetune", results=tmp_path / "logged", log=print, **common)
    logged = capfd.readouterr()
    assert "%|" in logged.err and "[run] finetune on rte, seed 2" in logged.out
    run("finetune", results=tmp_path / "silent", log=None, **common)
    silent = capfd.readouterr()
    assert "%|" not in silent.err and silent.out == ""
    assert len(load_records(tmp_path / "silent")) == 1

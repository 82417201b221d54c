"""Per-example dev predictions: every finished run writes its student's beside its record
and its teacher's once per suite, task and teacher key, each named and checksummed by the
record; readers check them and name a file that is missing or damaged."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from harness.cli import app
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task
from harness.experiments.predictions import (
    PredictionsError,
    SplitPredictions,
    load_predictions,
    predictions_path,
    write_predictions,
)
from harness.experiments.runner import SuiteRunner
from harness.experiments.store import ResultsStore
from harness.experiments.suites import load_suite
from harness.python_api import predictions_frame
from harness.reporting.prediction_tables import agreement, check_predictions
from harness.reporting.report import PREDICTIONS_WARNING
from tests.conftest import tiny_suite_dict

RUNS = (("rte", 1), ("rte", 2), ("stsb", 1))
DEV_ROWS = 24
"""The tiny data's dev rows (tests/conftest.py: write_tiny_glue)."""


@pytest.fixture(scope="module")
def tiny_store(tiny_data_dir, tiny_teacher_dir, tmp_path_factory) -> tuple[Path, Path, dict]:
    """kd on the tiny RTE (seeds 1 and 2) and STS-B (seed 1): the suite file, the results
    root and the outcomes by (task, seed)."""
    folder = tmp_path_factory.mktemp("predictions")
    suite_file = folder / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump({**tiny_suite_dict(tiny_data_dir, tiny_teacher_dir),
                                          "seeds": [1, 2]}))
    runner = SuiteRunner(load_suite(str(suite_file)), folder / "results", folder / "cache",
                         log=lambda _: None)
    outcomes = {(task, seed): runner.run_one("kd", task, seed) for task, seed in RUNS}
    return suite_file, folder / "results", outcomes


@pytest.mark.e2e
def test_a_run_keeps_its_dev_predictions_which_give_its_dev_scores(tiny_store):
    _, root, outcomes = tiny_store
    for (task_name, _), outcome in outcomes.items():
        task = get_task(task_name)
        record = outcome.record
        summary = record.predictions
        path = outcome.path.with_name(outcome.path.stem + ".predictions.npz")
        assert summary is not None and summary.file == path.name and path.is_file()
        assert hashlib.sha256(path.read_bytes()).hexdigest() == summary.sha256
        # the stored record says the same as the one returned
        stored = json.loads(outcome.path.read_text())["predictions"]
        assert stored == summary.model_dump()
        assert summary.kind == ("scores" if task.is_regression else "logits")
        assert summary.examples == {"dev": DEV_ROWS}
        with np.load(path, allow_pickle=False) as archive:  # a plain npz, no objects
            assert sorted(archive.files) == ["dev.ids", "dev.values"]
        predictions = load_predictions(record, root)
        dev = predictions["dev"]
        assert dev.ids.tolist() == list(range(DEV_ROWS))  # the data's idx, in row order
        assert dev.values.dtype == np.float32
        assert dev.values.shape == ((DEV_ROWS,) if task.is_regression else (DEV_ROWS, 2))
        labels = _dev_labels(root, task_name)
        assert TaskEvaluator(task).score(dev.values, labels) == record.dev["dev"]
        assert record.main_score == record.dev["dev"][task.main_metric]


def _dev_labels(root: Path, task_name: str) -> np.ndarray:
    """The tiny dev split's gold labels, as the runner reads them."""
    from harness.data.loading import load_task

    suite = load_suite(str(root.parent / "tiny.yaml"))
    data = load_task(get_task(task_name), source="local", data_dir=suite.data.dir,
                     test_splits=False)
    return np.asarray(data.splits["dev"]["label"])


@pytest.mark.e2e
def test_the_teachers_predictions_are_written_once_per_task_and_key(tiny_store):
    _, root, outcomes = tiny_store
    teachers = sorted((root / "tiny" / "teachers").iterdir())
    assert [path.name.split("-")[0] for path in teachers] == ["rte", "stsb"]
    first, second = (outcomes["rte", seed].record.teacher for seed in (1, 2))
    assert first.predictions == second.predictions  # one file, named alike by both runs
    path = root / "tiny" / "teachers" / first.predictions.file
    assert path == teachers[0] and first.predictions.file.startswith(f"rte-{first.key[:16]}")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == first.predictions.sha256
    record = outcomes["rte", 1].record
    predictions = load_predictions(record, root, teacher=True)
    assert TaskEvaluator(get_task("rte")).score(
        predictions["dev"].values, _dev_labels(root, "rte")) == record.teacher.dev["dev"]
    # the same predictions again leave the file as it is: its bytes depend on them alone
    stamp = path.stat().st_mtime_ns
    again = write_predictions(path, get_task("rte"), {
        "dev": (predictions["dev"].ids, predictions["dev"].values)})
    assert again == first.predictions and path.stat().st_mtime_ns == stamp


def test_agreement_matches_examples_by_id():
    ids = np.array([3, 1, 0, 2])
    student = SplitPredictions(ids, np.array([[0.0, 1.0], [2.0, 0.0], [1.0, 0.0],
                                              [0.0, 3.0]], dtype=np.float32))
    # the teacher's rows in another order: examples 0, 1, 2, 3 -> classes 0, 1, 1, 1
    teacher = SplitPredictions(np.array([0, 1, 2, 3]), np.array(
        [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32))
    # student: example 3 -> 1, 1 -> 0, 0 -> 0, 2 -> 1: 3 of 4 agree (example 1 does not)
    assert agreement(student, teacher) == 0.75
    scores = np.array([0.5, 2.0, 4.5, 3.0, 1.0], dtype=np.float32)
    theirs = np.array([1.0, 2.5, 4.0, 3.5, 0.0], dtype=np.float32)
    r = stats.pearsonr(scores, theirs).statistic
    assert agreement(SplitPredictions(np.arange(5), scores),
                     SplitPredictions(np.arange(5)[::-1].copy(), theirs[::-1].copy())) \
        == pytest.approx(r)
    assert agreement(SplitPredictions(np.arange(5), np.full(5, 2.0)),
                     SplitPredictions(np.arange(5), theirs)) == 0.0
    with pytest.raises(ValueError, match="not on the same examples"):
        agreement(SplitPredictions(np.arange(5), scores),
                  SplitPredictions(np.arange(1, 6), theirs))


@pytest.mark.e2e
def test_missing_and_damaged_files_are_named_by_the_loader_and_the_report(
        tiny_store, tmp_path):
    suite_file, original, outcomes = tiny_store
    root = tmp_path / "results"
    shutil.copytree(original, root)
    records = {key: outcome.record for key, outcome in outcomes.items()}
    damaged = predictions_path(records["rte", 1], root)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    missing = predictions_path(records["stsb", 1], root)
    missing.unlink()
    with pytest.raises(PredictionsError, match="damaged: its sha256") as error:
        load_predictions(records["rte", 1], root)
    assert str(damaged) in str(error.value)
    with pytest.raises(PredictionsError, match="missing") as error:
        load_predictions(records["stsb", 1], root)
    assert str(missing) in str(error.value)
    check = check_predictions(records.values(), root)
    assert len(check.problems) == 2 and check.without == 0
    assert check.agreement["seed"].tolist() == [2]  # the one run whose files are whole
    out = tmp_path / "report"
    done = CliRunner().invoke(app, ["report", "--suite", str(suite_file), "--results",
                                    str(root), "--out", str(out), "--no-figures"])
    assert done.exit_code == 0, done.output
    assert f"WARNING: {PREDICTIONS_WARNING}" in done.output
    markdown = (out / "leaderboard.md").read_text()
    for path in (damaged, missing):
        assert str(path) in done.output and str(path) in markdown
    assert "## Teacher-student agreement (dev)" in markdown
    page = (out / "leaderboard.html").read_text()
    assert '<h2 id="agreement">' in page and 'class="dataframe agreement"' in page
    with pytest.raises(PredictionsError, match="damaged"):
        predictions_frame(root, suite="tiny")


@pytest.mark.e2e
def test_records_without_predictions_are_counted_and_the_report_has_no_agreement(
        tiny_store, tmp_path):
    """A store of records made before predictions were kept reports as it did: no warning,
    no agreement section, and one line counting them."""
    suite_file, original, _ = tiny_store
    root = tmp_path / "results"
    shutil.copytree(original, root)
    for path in (root / "tiny").glob("kd/*/*.json"):
        document = json.loads(path.read_text())
        del document["predictions"], document["teacher"]["predictions"]
        path.write_text(json.dumps(document))
    for path in root.glob("**/*.predictions.npz"):
        path.unlink()
    out = tmp_path / "report"
    done = CliRunner().invoke(app, ["report", "--suite", str(suite_file), "--results",
                                    str(root), "--out", str(out), "--no-figures"])
    assert done.exit_code == 0, done.output
    assert "3 of 3 runs name no dev predictions file" in done.output
    assert PREDICTIONS_WARNING not in done.output
    assert "agreement" not in (out / "leaderboard.md").read_text().lower()
    frame = predictions_frame(root, suite="tiny")
    assert frame.empty and len(frame.attrs["without_predictions"]) == 3


@pytest.mark.e2e
def test_predictions_frame_gives_one_row_per_example_with_the_teachers(tiny_store):
    _, root, outcomes = tiny_store
    frame = predictions_frame(root, suite="tiny")
    assert len(frame) == DEV_ROWS * len(RUNS) and frame.attrs["without_predictions"] == []
    rte = frame[(frame["task"] == "rte") & (frame["seed"] == 1)]
    record = outcomes["rte", 1].record
    student = load_predictions(record, root)["dev"]
    teacher = load_predictions(record, root, teacher=True)["dev"]
    assert rte["example_id"].tolist() == student.ids.tolist()
    assert rte["predicted"].tolist() == student.values.argmax(axis=-1).tolist()
    assert rte["teacher_predicted"].tolist() == teacher.values.argmax(axis=-1).tolist()
    stsb = frame[frame["task"] == "stsb"]
    assert np.allclose(stsb["predicted"].to_numpy(float),
                       load_predictions(outcomes["stsb", 1].record, root)["dev"].values)
    assert ResultsStore(root).find(record.run_id) == outcomes["rte", 1].path

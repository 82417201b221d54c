"""Checkpoint selection: the suite's ``selection`` decides which checkpoint a run and its
teacher keep and score, the record keeps the last and the best-of-dev scores either way,
and the protocol is part of the run id and the teacher's key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.experiments.record import SelectionSummary
from harness.experiments.suites import load_suite
from tests.conftest import tiny_suite_dict


def _runner(tmp_path: Path, data: Path, teacher: Path, selection: str | None, steps: int = 6):
    from harness.experiments.runner import SuiteRunner

    values = tiny_suite_dict(data, teacher, steps=steps)
    # an evaluation every 2 steps: three looks at the dev set, the last at the last step
    values["training"]["eval_every_steps"] = 2
    values["teacher"]["training"]["eval_every_steps"] = 2
    if selection is not None:
        values["selection"] = selection
    suite_file = tmp_path / f"tiny-{selection}.yaml"
    suite_file.write_text(yaml.safe_dump(values))
    return SuiteRunner(load_suite(str(suite_file)), tmp_path / f"results-{selection}",
                       tmp_path / "cache", log=lambda _: None)


def test_the_summary_names_the_last_and_the_first_best_evaluation() -> None:
    evaluations = [{"step": 2, "epoch": 0.5, "accuracy": 50.0, "f1": 1.0},
                   {"step": 4, "epoch": 1.0, "accuracy": 60.0, "f1": 2.0},
                   {"step": 6, "epoch": 1.5, "accuracy": 60.0, "f1": 3.0},
                   {"step": 8, "epoch": 2.0, "accuracy": 55.0, "f1": 4.0}]
    summary = SelectionSummary.of("last", "task", evaluations, "accuracy")
    assert (summary.best_step, summary.last_step, summary.evaluations) == (4, 8, 4)
    assert summary.best == {"accuracy": 60.0, "f1": 2.0}
    assert summary.last == {"accuracy": 55.0, "f1": 4.0}
    assert summary.gain == pytest.approx(5.0)
    assert SelectionSummary.of("last", "task", [], "accuracy") is None


@pytest.mark.e2e
@pytest.mark.parametrize("task, metric", [("rte", "accuracy"), ("stsb", "pearson")])
def test_last_scores_the_last_checkpoint_and_best_dev_the_best(
        tiny_data_dir, tiny_teacher_dir, tmp_path: Path, task: str, metric: str) -> None:
    last = _runner(tmp_path, tiny_data_dir, tiny_teacher_dir, "last")
    best = _runner(tmp_path, tiny_data_dir, tiny_teacher_dir, "best-dev")
    by_last = last.run_one("finetune", task, seed=1).record
    by_best = best.run_one("finetune", task, seed=1).record

    evaluations = by_last.stages[-1].evaluations
    assert len(evaluations) == 3 and evaluations[-1]["step"] == 6
    # the same training either way: the protocol decides only which checkpoint is kept
    assert evaluations == by_best.stages[-1].evaluations
    assert by_last.main_score == pytest.approx(evaluations[-1][metric], abs=1e-9)
    assert by_best.main_score == pytest.approx(max(e[metric] for e in evaluations), abs=1e-9)
    for record, protocol in ((by_last, "last"), (by_best, "best-dev")):
        selection = record.selection
        assert selection is not None and selection.protocol == protocol
        assert selection.last[metric] == evaluations[-1][metric]
        assert selection.best[metric] == max(e[metric] for e in evaluations)
        assert selection.gain == pytest.approx(selection.best[metric] - selection.last[metric])
        assert record.teacher.selection is not None
        assert record.teacher.selection.protocol == protocol
    # the predictions kept are the scored checkpoint's: they give the record's score
    from harness.data.metrics import TaskEvaluator
    from harness.data.tasks import get_task
    from harness.experiments.predictions import predictions_path, read_predictions

    labels = last.planner.prepare_task(task).splits["dev"].labels
    for record, runner in ((by_last, last), (by_best, best)):
        path = predictions_path(record, runner.store.root)
        values = read_predictions(path, record.predictions, get_task(task).num_labels)
        score = TaskEvaluator(get_task(task)).score(values["dev"].values, labels)[metric]
        assert score == pytest.approx(record.main_score, abs=1e-4)


@pytest.mark.e2e
def test_the_protocol_is_part_of_the_run_id_and_the_teachers_key(
        tiny_data_dir, tiny_teacher_dir, tmp_path: Path) -> None:
    last = _runner(tmp_path, tiny_data_dir, tiny_teacher_dir, "last")
    best = _runner(tmp_path, tiny_data_dir, tiny_teacher_dir, "best-dev")
    default = _runner(tmp_path, tiny_data_dir, tiny_teacher_dir, None)
    spec_last = last.planner.resolve("kd", "rte", 1).spec
    spec_best = best.planner.resolve("kd", "rte", 1).spec
    assert spec_last["selection"] == "last" and "selection" not in spec_best
    assert spec_last["teacher"]["key"] != spec_best["teacher"]["key"]
    assert last.planner.run_id("kd", "rte", 1) != best.planner.run_id("kd", "rte", 1)
    assert default.planner.run_id("kd", "rte", 1) == last.planner.run_id("kd", "rte", 1)


def test_an_unknown_protocol_is_refused_with_its_key(tiny_data_dir, tiny_teacher_dir,
                                                     tmp_path: Path) -> None:
    values = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    values["selection"] = "best"
    suite_file = tmp_path / "bad.yaml"
    suite_file.write_text(yaml.safe_dump(values))
    with pytest.raises(Exception, match="selection"):
        load_suite(str(suite_file))

"""The leaderboard's baseline-relative aggregate (harness.reporting.report): each run's share
of the teacher's margin over the majority / mean baseline, the rows' mean and IQM of those
shares with task-stratified intervals, a flagged task left out of the ``_unflagged``
aggregate, SDs with ddof 1, seeds that all scored the same marked, the ranking by the
share and not by the plain average, the displayed columns and the README's table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.reporting.report import (
    AVERAGE_HEADER,
    PCT_HEADER,
    SELECTION_GAIN_HEADER,
    _run_row,
    ci_table,
    display_table,
    leaderboard,
)
from tests.records import run_record

TASKS = ["cola", "sst2", "rte"]
TEACHER = {"cola": 50.0, "sst2": 90.0, "rte": 58.0}
BASELINE = {"cola": 0.0, "sst2": 50.0, "rte": 55.0}  # RTE's teacher is 3 points above: flagged
SCORES = {  # label -> task -> scores of seeds 1, 2, 3
    # a: far from the teacher on SST-2, close on CoLA and RTE; b the other way round. b's
    # plain average is higher (SST-2's points are many), a's share of the margins is.
    "a": {"cola": [40.0, 40.0, 40.0], "sst2": [60.0, 62.0, 64.0], "rte": [56.0, 57.0, 58.0]},
    "b": {"cola": [20.0, 22.0, 24.0], "sst2": [86.0, 88.0, 90.0], "rte": [55.0, 55.5, 56.0]},
    "c": {"cola": [30.0]},  # one seed, one task: a partial row
}
GAINS = {"a": [0.0, 1.0, 2.0], "b": [0.5, 0.5, 0.5], "c": [0.0]}


def _share(label: str, task: str) -> list[float]:
    return [(score - BASELINE[task]) / (TEACHER[task] - BASELINE[task])
            for score in SCORES[label][task]]


def runs_frame() -> pd.DataFrame:
    return pd.DataFrame([
        {"label": label, "method": label, "student": "4L-312", "task": task, "seed": seed,
         "score": score, "teacher_score": TEACHER[task], "baseline": BASELINE[task],
         "selection_gain": GAINS[label][seed - 1], "params_total": 1,
         "params_non_embedding": 1, "run_id": f"{label}-{task}-{seed}", "seconds": 1.0}
        for label, tasks in SCORES.items() for task, scores in tasks.items()
        for seed, score in enumerate(scores, start=1)])


@pytest.fixture(scope="module")
def board() -> pd.DataFrame:
    return leaderboard(runs_frame(), TASKS, resamples=1000)


def test_each_tasks_share_is_the_mean_of_the_seeds_shares_of_the_teachers_margin(board):
    rows = board.set_index("label")
    assert rows.loc["a", "cola_share"] == pytest.approx(0.8)
    assert rows.loc["a", "sst2_share"] == pytest.approx(np.mean([10 / 40, 12 / 40, 14 / 40]))
    assert rows.loc["b", "rte_share"] == pytest.approx(np.mean([0.0, 0.5 / 3, 1 / 3]))
    for label in ("a", "b"):
        for task in TASKS:
            assert rows.loc[label, f"{task}_share"] == pytest.approx(np.mean(_share(label, task)))
    teacher = rows.loc["teacher"]
    assert [teacher[f"{task}_share"] for task in TASKS] == [1.0, 1.0, 1.0]
    assert teacher["dev_share_mean"] == teacher["dev_share_iqm"] == 1.0
    assert teacher["dev_share_mean_low"] == teacher["dev_share_mean_high"] == 1.0


def test_cells_show_the_sd_with_ddof_1_and_mark_seeds_that_all_scored_the_same(board):
    rows = board.set_index("label")
    assert rows.loc["a", "sst2_std"] == pytest.approx(2.0)  # ddof 0 would give 1.63
    assert rows.loc["b", "rte_std"] == pytest.approx(np.std([55.0, 55.5, 56.0], ddof=1))
    assert rows.loc["a", "cola_zero_variance"] and rows.loc["a", "cola_std"] == 0.0
    # the t interval of equal seeds has zero width: agreement, not certainty
    assert rows.loc["a", "cola_ci_low"] == rows.loc["a", "cola_ci_high"] == 40.0
    assert not rows.loc["b", "cola_zero_variance"] and not rows.loc["a", "sst2_zero_variance"]
    assert pd.isna(rows.loc["c", "cola_std"]) and not rows.loc["c", "cola_zero_variance"]
    assert not rows.loc["teacher", "cola_zero_variance"]


def test_the_aggregate_is_the_mean_and_iqm_of_every_task_and_seeds_share(board):
    rows = board.set_index("label")
    for label in ("a", "b"):
        shares = [share for task in TASKS for share in _share(label, task)]
        row = rows.loc[label]
        assert row["dev_share_mean"] == pytest.approx(np.mean(shares))
        assert row["dev_share_mean_low"] < row["dev_share_mean"] < row["dev_share_mean_high"]
        assert row["dev_share_iqm"] == pytest.approx(stats.trim_mean(shares, 0.25))
        assert row["dev_share_iqm_low"] <= row["dev_share_iqm"] <= row["dev_share_iqm_high"]
    # a's interval: each task's seeds resampled within the task, so its width comes from the
    # seeds' spread within tasks only (CoLA's equal seeds add none), far narrower than the
    # range of its nine shares
    assert rows.loc["a", "dev_share_mean_high"] - rows.loc["a", "dev_share_mean_low"] < 0.25
    assert pd.isna(rows.loc["c", "dev_share_mean"])  # a partial row has no 3-task aggregate
    again = leaderboard(runs_frame(), TASKS, resamples=1000).set_index("label")
    assert again.loc["a", "dev_share_mean_low"] == rows.loc["a", "dev_share_mean_low"]
    assert rows.loc["a", "selection_gain"] == pytest.approx(1.0)
    assert rows.loc["b", "selection_gain"] == pytest.approx(0.5)


def test_a_task_whose_teacher_is_near_its_baseline_is_flagged_and_left_out_too(board):
    assert board.attrs["flagged_tasks"] == ["rte"]
    rows = board.set_index("label")
    for label in ("a", "b"):
        shares = _share(label, "cola") + _share(label, "sst2")
        row = rows.loc[label]
        assert row["dev_share_mean_unflagged"] == pytest.approx(np.mean(shares))
        assert row["dev_share_iqm_unflagged"] == pytest.approx(stats.trim_mean(shares, 0.25))
        assert (row["dev_share_mean_low_unflagged"] <= row["dev_share_mean_unflagged"]
                <= row["dev_share_mean_high_unflagged"])
    assert rows.loc["teacher", "dev_share_mean_unflagged"] == 1.0
    # at a margin of 2 points no task is flagged, and there is no second aggregate
    wide = leaderboard(runs_frame(), TASKS, resamples=200, low_teacher_margin=2.0)
    assert wide.attrs["flagged_tasks"] == []
    assert wide["dev_share_mean_unflagged"].isna().all()


def test_rows_are_ranked_by_the_share_of_the_margin_not_by_the_plain_average(board):
    rows = board.set_index("label")
    assert rows.loc["b", "average"] > rows.loc["a", "average"]  # 55.17 against 53.00
    assert rows.loc["a", "dev_share_mean"] > rows.loc["b", "dev_share_mean"]
    assert list(board["label"]) == ["teacher", "a", "b", "c"]  # the partial row last
    assert rows.loc["a", "pct_of_teacher"] == pytest.approx(100 * 53.0 / np.mean([50, 90, 58]))


def test_the_displayed_table_leads_with_the_aggregate_and_labels_the_secondary_columns(board):
    table = display_table(board[board["complete"]], TASKS)
    lead = "3-task dev (share of teacher margin, mean [95% CI])"
    assert list(table.columns[:8]) == [
        "method", "student", lead, "3-task dev IQM [95% CI]",
        "2-task dev without RTE (mean [95% CI])", "CoLA (MCC)", "SST-2 (acc)", "RTE (acc)"]
    assert list(table.columns[8:11]) == [SELECTION_GAIN_HEADER, AVERAGE_HEADER, PCT_HEADER]
    assert AVERAGE_HEADER == "average (points, secondary)"
    assert PCT_HEADER == "% of teacher (no baseline, secondary)"
    rows = table.set_index("method")
    a = board.set_index("label").loc["a"]
    assert rows.loc["a", lead] == (f"{a['dev_share_mean']:.3f} [{a['dev_share_mean_low']:.3f}, "
                                   f"{a['dev_share_mean_high']:.3f}]")
    assert rows.loc["teacher", lead] == "1.000"
    assert rows.loc["a", "CoLA (MCC)"] == "40.00 ± 0.00 (3, all seeds equal)"
    assert rows.loc["a", "SST-2 (acc)"] == "62.00 ± 2.00 (3)"
    assert rows.loc["a", SELECTION_GAIN_HEADER] == "+1.00"
    intervals = ci_table(board, TASKS).set_index("method")
    assert intervals.loc["a", "CoLA (MCC)"] == "[40.00, 40.00] (all seeds equal)"
    assert intervals.loc["a", lead] == rows.loc["a", lead]
    assert "teacher" not in intervals.index


def test_a_runs_row_carries_its_baseline_and_its_selection():
    selection = {"protocol": "last", "stage": "task", "evaluations": 3, "last_step": 30,
                 "last": {"accuracy": 55.0}, "best_step": 20, "best": {"accuracy": 57.5},
                 "gain": 2.5}
    record = run_record(task="rte", main_metric="accuracy", main_score=55.0,
                        teacher={"baseline": {"accuracy": 52.7}}, selection=selection)
    row = _run_row("kd", record)
    assert (row["baseline"], row["selection_gain"]) == (52.7, 2.5)
    assert (row["last_score"], row["best_dev_score"]) == (55.0, 57.5)
    bare = _run_row("kd", run_record())
    assert all(np.isnan(bare[key]) for key in ("baseline", "selection_gain", "last_score",
                                               "best_dev_score"))


def test_the_readmes_table_leads_with_the_aggregate_in_the_leaderboards_order(board):
    spec = importlib.util.spec_from_file_location(
        "readme_leaderboard", Path(__file__).resolve().parents[2] / "scripts"
        / "readme_leaderboard.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    csv = board.drop(columns=["is_teacher"]).assign(
        source=["teacher (ours)" if teacher else "ours" for teacher in board["is_teacher"]])
    lines = script.board_table(csv, TASKS, BASELINE, low_teacher_margin=5.0,
                               confidence=0.95).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[2:4] == ["3-task dev (share of teacher margin, mean [95% CI])",
                           "2-task dev without RTE (mean [95% CI])"]
    assert header[-1] == "% of teacher (no baseline, secondary)"
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "majority / mean baseline", "teacher", "a", "b", "c"]
    a = board.set_index("label").loc["a"]
    assert (f"| a | 4L-312 | {a['dev_share_mean']:.3f} [{a['dev_share_mean_low']:.3f}, "
            f"{a['dev_share_mean_high']:.3f}] |") in lines[4]
    assert "| 40.00 (3) | 62.00 (3) | 57.00 (3) |" in lines[4]

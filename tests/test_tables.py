"""Comparison tables from records (harness.reporting.tables)."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.experiments.store import ResultsStore
from harness.reporting.tables import finished_records, score_table, with_anchors
from tests.records import run_record


def write(store: ResultsStore, method: str, task: str, seed: int, score: float,
          status: str = "finished") -> None:
    store.write(store.record_path("s", method, task, f"seed{seed}"),
                run_record(status=status, method=method, task=task, seed=seed,
                           main_score=score))


def test_means_over_seeds_average_over_tasks_and_failed_runs_left_out(tmp_path):
    store = ResultsStore(tmp_path)
    for seed, (a, b) in enumerate([(80.0, 50.0), (82.0, 54.0)], start=1):
        write(store, "kd", "mrpc", seed, a)
        write(store, "kd", "rte", seed, b)
    write(store, "kd", "rte", 3, 0.0, status="failed")
    write(store, "x", "mrpc", 1, 70.0)  # no rte: no average
    table = score_table(finished_records(tmp_path, "s"), ["mrpc", "rte"], ["x", "kd"])
    assert list(table.index) == ["x", "kd"]
    assert table.loc["kd", "mrpc"] == 81.0 and table.loc["kd", "rte"] == 52.0
    assert table.loc["kd", "average"] == pytest.approx(66.5)
    assert table.loc["kd", "seeds"] == 2 and table.loc["kd", "max_std"] == 2.0
    assert pd.isna(table.loc["x", "average"]) and pd.isna(table.loc["x", "rte"])


def test_anchor_rows_join_beside_ours(tmp_path):
    store = ResultsStore(tmp_path)
    write(store, "kd", "mrpc", 1, 80.0)
    table = score_table(finished_records(tmp_path, "s"), ["mrpc"])
    paper = pd.DataFrame({"paper_mrpc": [85.0, 1.0], "paper_average": [70.0, 2.0]},
                         index=["kd", "other"])
    joined = with_anchors(table, paper)
    assert joined.loc["kd", "paper_mrpc"] == 85.0 and joined.loc["kd", "mrpc"] == 80.0
    assert "other" not in joined.index


def test_runs_off_their_recipe_get_rows_of_their_own(tmp_path):
    """A tuned run, a grid-budget run and a run on another student shape are not averaged
    with the recipe's runs of the same method."""
    store = ResultsStore(tmp_path)
    write(store, "kd", "mrpc", 1, 80.0)
    variations = {"kd-tuned": {"tuned": {"study": "tune-s-kd-mrpc-x"},
                               "variation": {"overrides": {"params.alpha": 0.2}}},
                  "kd-grid": {"variation": {"task_epochs": 1.0}},
                  "kd-wide": {"variation": {"student": "wide"}}}
    for name, extra in variations.items():
        store.write(store.record_path("s", "kd", "mrpc", name),
                    run_record(method="kd", task="mrpc", seed=1, main_score=90.0, **extra))
    table = score_table(finished_records(tmp_path, "s"), ["mrpc"])
    assert table.loc["kd", "mrpc"] == 80.0
    assert sorted(table.index) == ["kd", "kd [grid budget]", "kd [tuned]", "kd [wide]"]


def test_ablation_changes_compare_the_same_tasks_ours_and_the_papers(tmp_path):
    """``change`` is against the full model on our tasks; ``paper_change`` on the paper's
    values of those same tasks, not on the paper's average over tasks we do not have."""
    from harness.reporting.tables import with_changes

    store = ResultsStore(tmp_path)
    for method, (mrpc, cola) in {"full": (80.0, 20.0), "no-x": (78.0, 10.0),
                                 "no-y": (81.0, 0.0)}.items():
        write(store, method, "mrpc", 1, mrpc)
        write(store, method, "cola", 1, cola)
    write(store, "partial", "mrpc", 1, 90.0)
    table = score_table(finished_records(tmp_path, "s"), ["mrpc", "cola"],
                        ["full", "no-x", "no-y", "partial"])
    paper = pd.DataFrame({"paper_mrpc": [86.0, 84.0], "paper_cola": [50.0, 40.0],
                          "paper_mnli": [83.0, 70.0], "paper_average": [73.0, 64.7]},
                         index=["full", "no-x"])
    changed = with_changes(with_anchors(table, paper), "full", ["mrpc", "cola"])
    assert changed.loc["full", "change"] == 0.0
    assert changed.loc["no-x", "change"] == pytest.approx(-6.0)   # (78+10)/2 - (80+20)/2
    assert changed.loc["no-y", "change"] == pytest.approx(-9.5)
    assert changed.loc["no-x", "paper_change"] == pytest.approx(-6.0)  # MNLI left out
    assert pd.isna(changed.loc["no-y", "paper_change"])  # no paper row
    assert pd.isna(changed.loc["partial", "change"])  # no CoLA
    assert with_changes(table, "absent", ["mrpc"]).equals(table)


def test_ablation_p_is_the_sign_flip_test_against_the_full_model(tmp_path):
    from harness.reporting.tables import with_paired_p

    store = ResultsStore(tmp_path)
    for seed in (1, 2, 3):
        for task, full in (("mrpc", 80.0), ("cola", 20.0)):
            write(store, "full", task, seed, full + seed)
            write(store, "worse", task, seed, full + seed - 5.0)  # below on all 6 pairs
            write(store, "mixed", task, seed, full + seed + (1.0 if seed == 1 else -1.0))
    records = finished_records(tmp_path, "s")
    table = with_paired_p(score_table(records, ["mrpc", "cola"]), records, "full")
    assert pd.isna(table.loc["full", "p_change"])
    assert table.loc["worse", "p_change"] == pytest.approx(2 / 64)  # the exact minimum
    assert table.loc["mixed", "p_change"] > 0.2

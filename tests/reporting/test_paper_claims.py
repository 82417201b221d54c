"""The papers' orderings as a family of task-by-task verdicts (harness.reporting.verdicts),
and published shares of the teacher beside ours (harness.reporting.paper_claims)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.config.schema import PaperOrdering, PaperShare, VerdictsConfig
from harness.experiments.suites import load_suite
from harness.reporting.paper_claims import shares_table
from harness.reporting.report import grid_shares, leaderboard
from harness.reporting.verdicts import VerdictInputs, family_table, run_family

TASKS = ["sst2", "mrpc", "rte", "stsb", "cola"]


def runs_of(label: str, base: float, gap: np.ndarray, seeds: int = 3) -> pd.DataFrame:
    """One row per (task, seed): base + per-pair gap, with the report's run columns."""
    rows = []
    for index, (task, seed) in enumerate((t, s) for t in TASKS for s in range(1, seeds + 1)):
        rows.append({"label": label, "method": label, "student": "4L-192", "task": task,
                     "seed": seed, "score": base + float(gap[index]), "teacher_score": 90.0,
                     "params_total": 1, "params_non_embedding": 1})
    return pd.DataFrame(rows)


def _family(runs: pd.DataFrame, orderings: list[PaperOrdering]) -> pd.DataFrame:
    inputs = VerdictInputs(runs, {}, Path("."), {}, {}, VerdictsConfig())
    pairs = [(o.better, o.worse, o.relation, o.source) for o in orderings]
    return family_table(run_family(inputs, "paper orderings", pairs, TASKS))


def test_an_ordering_is_decided_task_by_task_after_the_familys_holm_adjustment():
    """kd is 2 points above finetune on SST-2 on every seed give or take 0.1 (a paired t
    p under 0.001), level elsewhere; tinybert is 2 below finetune on MRPC alike. The
    level tasks' differences do not vary over seeds (no interval, no test); Holm over the
    family's two tests keeps both: kd wins on SST-2 only, tinybert loses on MRPC only; a
    pair without runs gives no row."""
    level = np.zeros(15)
    up = level.copy()
    up[:3] = [2.0, 2.1, 1.9]          # sst2, seeds 1-3
    down = level.copy()
    down[3:6] = [-2.0, -2.1, -1.9]    # mrpc
    wobble = np.resize([0.3, -0.2, 0.1], 15)
    runs = pd.concat([runs_of("finetune", 70.0, wobble), runs_of("kd", 70.0, wobble + up),
                      runs_of("tinybert", 70.0, wobble + down)])
    table = _family(runs, [PaperOrdering(better="kd", worse="finetune", source="a"),
                           PaperOrdering(better="tinybert", worse="finetune", source="b"),
                           PaperOrdering(better="bilstm-soft", worse="bilstm", source="c")])
    outcome = table.set_index(["comparison", "task"])["outcome"]
    assert outcome[("kd > finetune", "sst2")] == "wins"
    assert outcome[("tinybert > finetune", "mrpc")] == "loses"
    # the other tasks: no difference, every seed alike (no interval, no test)
    assert set(outcome.drop([("kd > finetune", "sst2"),
                             ("tinybert > finetune", "mrpc")])) == {"no test"}
    assert "bilstm-soft > bilstm" not in set(table["comparison"])
    tested = table[np.isfinite(table["p"])]
    assert len(tested) == 2
    assert (tested["p_holm"] == np.minimum(1.0, 2 * tested["p"].min())).any()


def test_a_no_worse_claim_is_tested_as_non_inferiority():
    """bert-pkd >= kd-3L: 0.2 points below on every task (within the 1-point margin, seeds
    agreeing) is non-inferior; 3 points below on RTE loses there."""
    wobble = np.resize([0.3, -0.2, 0.1], 15)
    close = wobble + np.resize([-0.2, -0.25, -0.15], 15)
    far = close.copy()
    far[6:9] = [-3.0, -3.1, -2.9]  # rte
    runs = pd.concat([runs_of("kd-3L", 70.0, wobble), runs_of("bert-pkd", 70.0, close),
                      runs_of("distilbert", 70.0, far)])
    table = _family(runs, [
        PaperOrdering(better="bert-pkd", worse="kd-3L", relation=">=", source="a"),
        PaperOrdering(better="distilbert", worse="kd-3L", relation=">=", source="b")])
    outcome = table.set_index(["comparison", "task"])["outcome"]
    assert outcome[("bert-pkd >= kd-3L", "sst2")] == "non-inferior"
    assert outcome[("distilbert >= kd-3L", "rte")] == "loses"
    assert (table["p_non_inferiority_holm"].dropna() >= table["p_non_inferiority"].dropna()).all()


def test_only_seeds_both_rows_have_are_compared_and_other_rows_take_no_part():
    kd = runs_of("kd", 71.0, np.resize([0.3, -0.2, 0.1], 15))
    finetune = runs_of("finetune", 70.0, np.zeros(15))
    finetune = finetune[~((finetune["task"] == "cola") | (finetune["seed"] == 3))]
    tuned = runs_of("kd [tuned]", 10.0, np.zeros(15))        # its own row: not "kd"
    table = _family(pd.concat([kd, finetune, tuned]),
                    [PaperOrdering(better="kd", worse="finetune", source="x")])
    # no predictions files: per-task rows only, no across-task row
    assert list(table["task"]) == ["sst2", "mrpc", "rte", "stsb"]
    per_task = table[table["task"].isin(TASKS)]
    assert set(per_task["seeds"]) == {2}
    assert per_task["difference"].to_numpy() == pytest.approx(np.full(4, 1.05))


def test_shares_put_our_pct_of_teacher_beside_the_papers():
    runs = pd.concat([runs_of("tinybert", 72.0, np.zeros(15)),
                      runs_of("kd", 70.0, np.zeros(15)).query("task != 'cola'")])
    board = leaderboard(runs, TASKS)
    table = shares_table(board, [PaperShare(method="tinybert", pct_of_teacher=96.8, source="J"),
                                 PaperShare(method="kd", pct_of_teacher=90.0, source="K"),
                                 PaperShare(method="minilm", pct_of_teacher=99.0, source="W")])
    rows = table.set_index("method")
    assert rows.loc["tinybert", "ours (% of teacher)"] == 80.0  # 72 / 90
    assert rows.loc["tinybert", "paper (% of teacher)"] == 96.8
    assert pd.isna(rows.loc["kd", "ours (% of teacher)"])     # no CoLA: no average
    assert rows.loc["kd", "tasks"] == "incomplete row (no average)"
    assert rows.loc["minilm", "tasks"] == "no runs yet"


def test_the_grid_report_gives_the_shares_of_grid_rows_only():
    """glue-cpu gives TinyBERT's published share twice: for the grid's tinybert and for
    tinybert-full-da, a suite variant at the paper's augmentation budget that is no grid
    row. The grid's report shows only the first; the suite's report both."""
    config = load_suite("glue-cpu")
    assert "tinybert-full-da" in {share.method for share in config.paper_shares}
    assert [share.method for share in grid_shares(config)] == ["tinybert", "distilbert"]


def test_a_cells_interval_is_the_student_t_interval_over_its_seeds():
    """Over 3 seeds a percentile bootstrap is their range (labelled 95%); the report's
    interval is Student-t's."""
    from harness.reporting.stats import t_ci

    runs = runs_of("kd", 70.0, np.resize([0.0, 1.0, 3.0], 15))
    board = leaderboard(runs, TASKS).set_index("label")
    low, high = t_ci([70.0, 71.0, 73.0])
    assert (board.loc["kd", "rte_ci_low"], board.loc["kd", "rte_ci_high"]) == \
        pytest.approx((low, high))
    assert low < 70.0 and high > 73.0

"""The papers' orderings put through the report's paired test, and published shares of the
teacher beside ours (harness.reporting.paper_claims)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.api.suites import load_suite
from harness.config.schema import PaperOrdering, PaperShare
from harness.reporting.paper_claims import check_orderings, orderings_table, shares_table
from harness.reporting.report import grid_shares, leaderboard

TASKS = ["sst2", "mrpc", "rte", "stsb", "cola"]


def runs_of(label: str, base: float, gap: np.ndarray, seeds: int = 3) -> pd.DataFrame:
    """One row per (task, seed): base + per-pair gap, with the report's run columns."""
    rows = []
    for index, (task, seed) in enumerate((t, s) for t in TASKS for s in range(1, seeds + 1)):
        rows.append({"label": label, "method": label, "student": "4L-192", "task": task,
                     "seed": seed, "score": base + float(gap[index]), "teacher_score": 90.0,
                     "params_total": 1, "params_non_embedding": 1})
    return pd.DataFrame(rows)


def test_verdicts_follow_the_sign_flip_test_and_the_relation():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.3, size=15)
    runs = pd.concat([
        runs_of("finetune", 70.0, np.zeros(15)),
        runs_of("kd", 71.0, noise),            # +1 on every pair: significant
        runs_of("tinybert", 69.0, noise),      # -1 on every pair: significant the other way
        runs_of("bert-pkd", 70.0, np.resize([0.5, -0.5, 0.4], 15)),  # no clear difference
    ])
    tests = check_orderings(runs, [
        PaperOrdering(better="kd", worse="finetune", source="a"),
        PaperOrdering(better="tinybert", worse="finetune", source="b"),
        PaperOrdering(better="bert-pkd", worse="finetune", relation=">=", source="c"),
        PaperOrdering(better="bert-pkd", worse="finetune", source="d"),
        PaperOrdering(better="finetune", worse="kd", relation=">=", source="e"),
        PaperOrdering(better="bilstm-soft", worse="bilstm", source="f"),
    ])
    verdicts = [test.verdict for test in tests]
    assert verdicts == ["agrees (significant)", "contradicts (significant)",
                        "consistent (no significant loss)", "not separated",
                        "contradicts (significant)", "no common runs yet"]
    kd = tests[0].result
    assert kd.n_pairs == 15 and kd.wins == 15 and kd.p_permutation < 0.001
    assert abs(kd.mean_diff - (1.0 + noise.mean())) < 1e-9

    table = orderings_table(tests)
    assert list(table["paper's ordering"]) == [
        "kd > finetune", "tinybert > finetune", "bert-pkd >= finetune", "bert-pkd > finetune",
        "finetune >= kd", "bilstm-soft > bilstm"]
    assert table.loc[0, "sign-flip p"] == "< 0.001"
    assert table.loc[0, "wins/losses"] == "15/0"
    assert table.loc[5, "pairs"] == 0 and pd.isna(table.loc[5, "mean diff"])


def test_only_pairs_both_methods_have_are_compared_and_other_rows_take_no_part():
    kd = runs_of("kd", 71.0, np.zeros(15))
    finetune = runs_of("finetune", 70.0, np.zeros(15))
    finetune = finetune[finetune["task"] != "cola"]          # 12 common pairs
    tuned = runs_of("kd [tuned]", 10.0, np.zeros(15))        # its own row: not "kd"
    (test,) = check_orderings(pd.concat([kd, finetune, tuned]),
                             [PaperOrdering(better="kd", worse="finetune", source="x")])
    assert test.result.n_pairs == 12
    assert test.result.tasks == ("mrpc", "rte", "sst2", "stsb")
    assert test.result.mean_diff == 1.0


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


def test_orderings_are_one_family_whose_holm_adjusted_p_decides_significance():
    """Two orderings read together: one +1 on each of 5 pairs of one task (exact two-sided
    sign-flip p 2/32 = 0.0625 alone would not pass; on 6 pairs 2/64 = 0.031 would), the
    other no difference.  Holm over the two doubles the smaller p, so the first is not
    called significant, though its raw p is under 0.05."""
    gap = np.zeros(15)
    gap[:6] = 1.0  # sst2's 3 pairs and mrpc's 3 pairs: 6 positive, 9 ties
    runs = pd.concat([runs_of("finetune", 70.0, np.zeros(15)), runs_of("kd", 70.0, gap),
                      runs_of("bert-pkd", 70.0, np.zeros(15))])
    tests = check_orderings(runs, [
        PaperOrdering(better="kd", worse="finetune", source="a"),
        PaperOrdering(better="bert-pkd", worse="finetune", source="b")])
    first = tests[0].result
    assert first.p_permutation < 0.05 and first.family == 2
    assert first.p_holm == min(1.0, 2 * first.p_permutation) >= 0.05
    assert not first.significant and tests[0].verdict == "not separated"
    table = orderings_table(tests)
    assert table.loc[0, "Holm p"] == "0.062" and table.loc[0, "sign-flip p"] == "0.031"
    alone = check_orderings(runs, [PaperOrdering(better="kd", worse="finetune", source="a")])
    assert alone[0].result.significant and alone[0].verdict == "agrees (significant)"


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

"""The papers' published shares of the teacher, shown beside ours.

A suite lists the published % of teacher (``paper_shares``: TinyBERT's 96.8%) it shows beside
its rows. They are not the same quantity as ours (another teacher, other tasks, often the
test set), so the table says so; the papers' orderings (``paper_orderings``) are tested task
by task with the report's other verdicts (:mod:`harness.reporting.verdicts`).
"""

from __future__ import annotations

import pandas as pd

from harness.config.schema import PaperShare

SHARES_NOTE = ("Share of the teacher, ours beside the paper's. Not the same quantity: the "
               "paper's teacher is BERT-base and its share is over its own tasks and split "
               "(see source); ours is on this suite's dev sets. Our share of the teacher's "
               "margin over the baseline is the leaderboard's ranked figure; % of teacher "
               "(no baseline subtracted) is the paper's kind of ratio.")


def shares_table(board: pd.DataFrame, shares: list[PaperShare]) -> pd.DataFrame:
    """Each published share of the teacher beside our row's % of teacher (the leaderboard's
    ratio of averages, only for a row with every task). Rows are matched by label (the bare
    method name); a method on more than one student shape gives one line per shape."""
    lines = []
    for share in shares:
        rows = board[(board["label"] == share.method) & ~board["is_teacher"].astype(bool)]
        if rows.empty:
            lines.append({"method": share.method, "student": "-", "ours (% of teacher)": None,
                          "ours (share of teacher margin)": None,
                          "tasks": "no runs yet", "paper (% of teacher)": share.pct_of_teacher,
                          "source": share.source})
        for _, row in rows.iterrows():
            complete = bool(row["complete"]) and pd.notna(row["pct_of_teacher"])
            margin = row.get("dev_share_mean")
            lines.append({"method": share.method, "student": row["student"],
                          "ours (% of teacher)": round(float(row["pct_of_teacher"]), 1)
                          if complete else None,
                          "ours (share of teacher margin)": round(float(margin), 3)
                          if complete and margin is not None and pd.notna(margin) else None,
                          "tasks": "all of the suite's" if complete
                          else "incomplete row (no average)",
                          "paper (% of teacher)": share.pct_of_teacher,
                          "source": share.source})
    return pd.DataFrame(lines)

"""The papers' claims, tested on a suite's own runs.

A suite declares the orderings of methods that the papers report (``paper_orderings``: kd
above finetune, bert-pkd no worse than kd, ...) and the published shares of the teacher
(``paper_shares``: TinyBERT's 96.8%). The report puts each ordering through the same paired
test as its other comparisons (harness.reporting.stats.paired_comparison: the two methods'
runs paired on the (task, seed) pairs both have) and states a verdict whatever it shows:

- ``better > worse``: *agrees* where the sign-flip test is significant and the difference is
  positive, *contradicts* where it is significant and negative, else *not separated*;
- ``better >= worse`` (the paper claims no loss): *contradicts* only where the difference is
  significantly negative; *agrees* where it is significantly positive; else *consistent*.

The orderings are one family of claims read together: their sign-flip p-values are
Holm-adjusted over the orderings that have pairs, and the adjusted p decides "significant".

An ordering whose methods share no (task, seed) pair yet says so instead of a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness.config.schema import PaperOrdering, PaperShare
from harness.reporting.stats import PairedResult, format_p, holm_family, paired_comparison

ORDERINGS_NOTE = ("Paired over the (task, seed) pairs both rows have; differences in points "
                  "(better - worse), with a Student-t 95% CI; the sign-flip test's p, "
                  "Holm-adjusted over the orderings tested together, decides the verdict.")
SHARES_NOTE = ("Share of the teacher, ours beside the paper's (their teacher is BERT-base, "
               "ours the suite's):")


@dataclass(frozen=True)
class OrderingTest:
    ordering: PaperOrdering
    result: PairedResult

    @property
    def verdict(self) -> str:
        result = self.result
        if result.n_pairs == 0:
            return "no common runs yet"
        positive = result.mean_diff > 0
        if result.significant:
            return "agrees (significant)" if positive else "contradicts (significant)"
        return "consistent (no significant loss)" if self.ordering.relation == ">=" \
            else "not separated"

    @property
    def claim(self) -> str:
        return f"{self.ordering.better} {self.ordering.relation} {self.ordering.worse}"

    def row(self) -> dict[str, object]:
        """The report's table row: p-values and the CI as text (see `numbers` for a CSV)."""
        result = self.result
        empty = result.n_pairs == 0
        return {
            "paper's ordering": self.claim,
            "pairs": result.n_pairs,
            "tasks": ", ".join(result.tasks),
            "mean diff": None if empty else round(result.mean_diff, 2),
            "95% CI": None if empty else f"{result.ci_low:+.2f} to {result.ci_high:+.2f}",
            "sign-flip p": None if empty else format_p(result.p_permutation).lstrip("= "),
            "Holm p": None if empty or result.p_holm is None
            else format_p(result.p_holm).lstrip("= "),
            "Wilcoxon p": None if empty else format_p(result.p_wilcoxon).lstrip("= "),
            "wins/losses": None if empty else f"{result.wins}/{result.losses}",
            "per task": ", ".join(f"{task} {diff:+.2f}" for task, diff in
                                  result.per_task.items()),
            "verdict": self.verdict,
            "source": self.ordering.source,
        }

    def numbers(self) -> dict[str, object]:
        """The same with numbers where the table has text (the CSV's row)."""
        result = self.result
        return {"ordering": self.claim, "better": self.ordering.better,
                "worse": self.ordering.worse, "relation": self.ordering.relation,
                "pairs": result.n_pairs, "tasks": ", ".join(result.tasks),
                "mean_diff": result.mean_diff, "ci_low": result.ci_low,
                "ci_high": result.ci_high, "p_permutation": result.p_permutation,
                "p_holm": result.p_holm, "p_wilcoxon": result.p_wilcoxon, "wins": result.wins,
                "losses": result.losses, "ties": result.ties, "verdict": self.verdict,
                "source": self.ordering.source}


def check_orderings(runs: pd.DataFrame, orderings: list[PaperOrdering]) -> list[OrderingTest]:
    """Each ordering's paired test on `runs` (the report's runs: columns ``label``, ``task``,
    ``seed``, ``score``), differences better - worse in points. A method is the row labelled
    with its bare name: runs that departed from its recipe (tuned, another student, a grid
    budget) are rows of their own and take no part."""
    results = []
    for ordering in orderings:
        better = runs[runs["label"] == ordering.better]
        worse = runs[runs["label"] == ordering.worse]
        results.append(paired_comparison(better, worse, name_a=ordering.better,
                                         name_b=ordering.worse))
    return [OrderingTest(ordering, result)
            for ordering, result in zip(orderings, holm_family(results), strict=True)]


def orderings_table(tests: list[OrderingTest], *, numbers: bool = False) -> pd.DataFrame:
    return pd.DataFrame([test.numbers() if numbers else test.row() for test in tests])


def shares_table(board: pd.DataFrame, shares: list[PaperShare]) -> pd.DataFrame:
    """Each published share of the teacher beside our row's % of teacher (the leaderboard's
    ratio of averages, only for a row with every task). Rows are matched by label (the bare
    method name); a method on more than one student shape gives one line per shape."""
    lines = []
    for share in shares:
        rows = board[(board["label"] == share.method) & ~board["is_teacher"].astype(bool)]
        if rows.empty:
            lines.append({"method": share.method, "student": "-", "ours (% of teacher)": None,
                          "tasks": "no runs yet", "paper (% of teacher)": share.pct_of_teacher,
                          "source": share.source})
        for _, row in rows.iterrows():
            complete = bool(row["complete"]) and pd.notna(row["pct_of_teacher"])
            lines.append({"method": share.method, "student": row["student"],
                          "ours (% of teacher)": round(float(row["pct_of_teacher"]), 1)
                          if complete else None,
                          "tasks": "all of the suite's" if complete
                          else "incomplete row (no average)",
                          "paper (% of teacher)": share.pct_of_teacher,
                          "source": share.source})
    return pd.DataFrame(lines)

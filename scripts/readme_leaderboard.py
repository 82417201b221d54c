"""Rewrite the README's glue-cpu leaderboard table from the committed grid report.

`make report` runs this after `harness report --suite glue-cpu --grid`: the table between the
README's ``<!-- leaderboard:start -->`` and ``<!-- leaderboard:end -->`` markers then shows the
same means, seed counts and % of teacher as ``reports/glue-cpu-grid/leaderboard.csv``, with the
majority / mean baselines the records' teacher stage measured. ``--check`` exits 1 when the
README differs from what it would write (tests/test_reference_report.py uses it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.api.suites import load_suite
from harness.data.tasks import get_task
from harness.reporting.figures import METRIC_NAMES
from harness.reporting.report import collect_runs, task_baselines

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- leaderboard:start -->", "<!-- leaderboard:end -->"


def _cell(value: float, seeds: float | None = None) -> str:
    if pd.isna(value):
        return ""
    return f"{value:.2f}" + (f" ({int(seeds)})" if seeds is not None else "")


def leaderboard_table(suite: str = "glue-cpu", repo: Path = REPO) -> str:
    """The README's table: baseline row, teacher row, then the grid's rows in the suite's
    method order, each cell the mean over the seeds run so far with their number."""
    config = load_suite(suite)
    tasks = config.tasks
    board = pd.read_csv(repo / "reports" / f"{suite}-grid" / "leaderboard.csv")
    _, records = collect_runs(config, repo / "results", grid=True)
    baselines = task_baselines(records, tasks)
    header = ["method", "student"] + [
        f"{get_task(task).display_name} "
        f"({METRIC_NAMES.get(get_task(task).main_metric, get_task(task).main_metric)})"
        for task in tasks] + ["% of teacher"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.append("| majority / mean baseline | | "
                 + " | ".join(_cell(baselines.get(task, float("nan"))) for task in tasks)
                 + " | |")
    teacher = board[board["source"] == "teacher (ours)"].iloc[0]
    lines.append(f"| teacher | {teacher['student']} | "
                 + " | ".join(_cell(teacher[task]) for task in tasks) + " | 100 |")
    ours = board[board["source"] == "ours"].set_index("label")
    order = [method for method in config.grid.methods if method in ours.index]
    for method in order:
        row = ours.loc[method]
        pct = "" if pd.isna(row["pct_of_teacher"]) else f"{row['pct_of_teacher']:.1f}"
        lines.append(f"| {method} | {row['student']} | "
                     + " | ".join(_cell(row[task], row[f"{task}_n"]) for task in tasks)
                     + f" | {pct} |")
    return "\n".join(lines)


def rewritten(readme: str, table: str) -> str:
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    before, rest = readme.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{table}\n{END}{after}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when README.md's table is stale; write nothing")
    args = parser.parse_args()
    import datasets

    datasets.disable_progress_bars()  # the grid's data fingerprints read the task files
    path = REPO / "README.md"
    readme = path.read_text()
    new = rewritten(readme, leaderboard_table())
    if args.check:
        if new != readme:
            print("README.md's leaderboard is stale: run `make report`", file=sys.stderr)
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())

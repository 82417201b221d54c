"""Rewrite the README's glue-cpu leaderboard and TinyBERT ablation tables from the records.

`make report` runs this after `harness report --suite glue-cpu --grid`: the table between the
README's ``<!-- leaderboard:start -->`` and ``<!-- leaderboard:end -->`` markers then shows the
rows of ``reports/glue-cpu-grid/leaderboard.csv`` in its order, led by the share of the
teacher's margin over the baseline across tasks (mean and interval), with the same task means,
seed counts and (secondary) % of teacher, and the majority / mean baselines the records'
teacher stage measured; the one between
``<!-- ablation:start -->`` and ``<!-- ablation:end -->`` is `harness table --suite
tinybert-ablation` (ours beside the paper's). ``--check`` exits 1 when the README differs from
what it would write (tests/reporting/test_reference_report.py uses it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.config.published import load_published
from harness.data.tasks import get_task
from harness.experiments.suites import load_suite
from harness.reporting.figures import METRIC_NAMES
from harness.reporting.report import PCT_HEADER, collect_runs, share_headers, task_baselines
from harness.reporting.tables import finished_records, suite_table

REPO = Path(__file__).resolve().parent.parent
LEADERBOARD = "<!-- leaderboard:start -->", "<!-- leaderboard:end -->"
ABLATION = "<!-- ablation:start -->", "<!-- ablation:end -->"


def _cell(value: float, seeds: float | None = None) -> str:
    if pd.isna(value):
        return ""
    return f"{value:.2f}" + (f" ({int(seeds)})" if seeds is not None else "")


def leaderboard_table(suite: str = "glue-cpu", repo: Path = REPO) -> str:
    """The README's table from ``reports/<suite>-grid/leaderboard.csv`` and the grid's
    records' baselines (:func:`board_table`)."""
    config = load_suite(suite)
    board = pd.read_csv(repo / "reports" / f"{suite}-grid" / "leaderboard.csv")
    _, records = collect_runs(config, repo / "results", grid=True)
    return board_table(board, config.tasks, task_baselines(records, config.tasks),
                       low_teacher_margin=config.verdicts.low_teacher_margin,
                       confidence=config.verdicts.confidence)


def board_table(board: pd.DataFrame, tasks: list[str], baselines: dict[str, float], *,
                low_teacher_margin: float, confidence: float) -> str:
    """Baseline row, teacher row, then our rows in the leaderboard's order (``board``: the
    report's leaderboard.csv, ranked by the share of the teacher's margin): each row's
    cross-task share of the teacher's margin (mean [interval]; also without the flagged
    tasks, a teacher less than ``low_teacher_margin`` points above its baseline, where any
    is), each task's mean over the seeds run so far with their number, and the secondary
    % of teacher (no baseline subtracted)."""
    teacher = board[board["source"] == "teacher (ours)"].iloc[0]
    flagged = [task for task in tasks if task in baselines
               and teacher[task] - baselines[task] < low_teacher_margin]
    board.attrs.update(flagged_tasks=flagged, confidence=confidence)
    headers = share_headers(board, tasks)
    shares = ["dev_share_mean"] + (["dev_share_mean_unflagged"] if flagged else [])
    header = (["method", "student"] + [headers[name] for name in shares]
              + [_task_header(task) for task in tasks] + [PCT_HEADER])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.append("| majority / mean baseline | | " + " | ".join("0" for _ in shares) + " | "
                 + " | ".join(_cell(baselines.get(task, float("nan"))) for task in tasks)
                 + " | |")
    lines.append(f"| teacher | {teacher['student']} | " + " | ".join("1" for _ in shares)
                 + " | " + " | ".join(_cell(teacher[task]) for task in tasks) + " | 100 |")
    for _, row in board[board["source"] == "ours"].iterrows():
        pct = "" if pd.isna(row["pct_of_teacher"]) else f"{row['pct_of_teacher']:.1f}"
        lines.append(f"| {row['label']} | {row['student']} | "
                     + " | ".join(_share(row, name) for name in shares) + " | "
                     + " | ".join(_cell(row[task], row[f"{task}_n"]) for task in tasks)
                     + f" | {pct} |")
    return "\n".join(lines)


def _share(row: pd.Series, name: str) -> str:
    """``dev_share_mean`` or ``dev_share_mean_unflagged`` as "mean [low, high]"."""
    suffix = "_unflagged" if name.endswith("_unflagged") else ""
    value = row[name]
    if pd.isna(value):
        return ""
    return (f"{value:.3f} [{row[f'dev_share_mean_low{suffix}']:.3f}, "
            f"{row[f'dev_share_mean_high{suffix}']:.3f}]")


def _task_header(task: str) -> str:
    metric = get_task(task).main_metric
    return f"{get_task(task).display_name} ({METRIC_NAMES.get(metric, metric)})"


def ablation_table(suite: str = "tinybert-ablation", repo: Path = REPO) -> str:
    """The README's ablation table: each variant's mean over its seeds per task and its
    change against the full model, beside the paper's values and change on the same tasks."""
    config = load_suite(suite)
    tasks = config.tasks
    records = finished_records(config, repo / "results")
    records = records[records["task"].isin(tasks) & records["seed"].isin(config.seeds)
                      & records["method"].isin(config.default_methods())]
    if config.default_methods()[0] not in set(records["method"]):
        return (f"No runs of {suite} under the current protocol yet (`harness run --suite "
                f"{suite}`); the report's ablation table gives the verdicts task by task.")
    table = suite_table(config, records)
    published = load_published()
    groups = published[published["group"].isin(config.anchor_groups)]
    group_of = dict(zip(groups["method"], groups["group"], strict=True))
    full = config.default_methods()[0]
    counts = records.groupby(["method", "task"])["seed"].nunique()
    header = (["variant", "paper's table"] + [_task_header(task) for task in tasks]
              + ["change", "p", "Holm p"]
              + [f"paper: {get_task(task).display_name}" for task in tasks]
              + ["paper: change"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, row in table.iterrows():
        p_value = row["p_change"] if pd.notna(row["change"]) else float("nan")
        p_holm = row["p_holm"] if pd.notna(row["change"]) else float("nan")
        group = "full model" if method == full else group_of.get(method, "not in the paper")
        lines.append(f"| {method} | {group} | "
                     + " | ".join(_cell(row[task], counts.get((method, task))) for task in tasks)
                     + f" | {_signed(row['change'])} | {_p(p_value)} | {_p(p_holm)} | "
                     + " | ".join(_cell(row.get(f"paper_{task}", float("nan")))
                                  for task in tasks)
                     + f" | {_signed(row.get('paper_change', float('nan')))} |")
    lines.append("")
    names = ", ".join(get_task(task).display_name for task in tasks)
    lines.append(f"glue-cpu dev, mean over seeds {', '.join(map(str, config.seeds))} (their "
                 f"number in brackets); change = the mean over {names} minus {full}'s, the "
                 "paper's on the same tasks; p = the two-sided sign-flip test of the change "
                 f"over the (task, seed) pairs (smallest possible with {len(tasks)} tasks x "
                 f"{len(config.seeds)} seeds: {2 / 2 ** (len(tasks) * len(config.seeds)):.3f}); "
                 "Holm p = those p-values Holm-adjusted over the variants, which are read "
                 "together.")
    return "\n".join(lines)


def _p(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.3f}"


def _signed(value: float) -> str:
    return "" if pd.isna(value) else f"{value:+.2f}"


def rewritten(readme: str, table: str, markers: tuple[str, str] = LEADERBOARD) -> str:
    start, end = markers
    if start not in readme or end not in readme:
        raise SystemExit(f"README.md has no {start} ... {end} block")
    before, rest = readme.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{table}\n{end}{after}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when README.md's table is stale; write nothing")
    args = parser.parse_args()
    import datasets

    datasets.disable_progress_bars()  # the grid's data fingerprints read the task files
    path = REPO / "README.md"
    readme = path.read_text()
    new = rewritten(rewritten(readme, leaderboard_table()), ablation_table(), ABLATION)
    if args.check:
        if new != readme:
            print("README.md's tables are stale: run `make report`", file=sys.stderr)
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``harness table`` and ``harness report``: a suite's scores as a table, and its
leaderboard report."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.shared import recipe_options
from harness.common.cli_options import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    CacheOpt,
    DataDirOpt,
    GridOnlyOpt,
    ResultsOpt,
    SetOpt,
    SuiteOpt,
    TeacherOpt,
    echo,
    error_text,
    fail,
    quiet_libraries,
    recipe_overrides,
    split_csv,
)
from harness.common.paths import contained
from harness.config.schema import ConfigError, resolve_suite_path
from harness.experiments.suites import check_method_names, load_suite


def table(
    suite: SuiteOpt = "glue-cpu",
    results: ResultsOpt = DEFAULT_RESULTS,
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="rows to show (default: an ablation suite's (anchor_groups) "
        "own variants, every method with records otherwise)")] = None,
    grid: GridOnlyOpt = False,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
) -> None:
    """Print method x task scores (mean over seeds) with the suite's paper anchors beside.

    A row marked * holds runs, on some task, that are not the suite as it now reads (an
    earlier recipe, a --set); the notes under the table name them."""
    import pandas as pd

    from harness.reporting.tables import finished_records, markdown, suite_table

    notes: list[str] = []  # the store's and the check's log, printed under the table
    not_current: set[str] = set()
    try:
        # The suite as the runs were made: a grid run with --set plans its cells with it.
        config = load_suite(suite, recipe_overrides(set_, data_dir, teacher))
        method = split_csv(method)
        check_method_names(config, method or [], "--method", str(resolve_suite_path(suite)))
        if grid:
            quiet_libraries()
            from harness.experiments.grid import Grid

            common = Grid(config, results, "sqlite://", log=lambda _: None)
            planned = common.plan()
            records = pd.DataFrame(common.records(planned),
                                   columns=["method", "task", "seed", "score", "seconds"])
            if missing := common.missing(planned):
                typer.secho(f"WARNING: {missing}", err=True)
        else:
            records = finished_records(config, results, notes.append)
            records = records[records["task"].isin(config.tasks)
                              & records["seed"].isin(config.seeds)]
            shown = set(zip(records["method"], records["task"], strict=True))
            not_current = {row.label for row in records.attrs["not_current"]
                           if (row.label, row.task) in shown}
        if records.empty:
            raise ValueError(f"no finished records for suite {config.name} under {results}")
        table = suite_table(config, records, method)
    except (ConfigError, KeyError, FileNotFoundError, ValueError) as error:
        for line in notes:
            echo(line)
        fail(error_text(error))
        return
    table = table.rename(index=lambda label: f"{label} *" if label in not_current else label)
    echo(markdown(table))
    for line in notes:
        echo(line)


def report(
    suite: SuiteOpt = "glue-cpu",
    results: ResultsOpt = DEFAULT_RESULTS,
    out: Annotated[Path | None, typer.Option(
        help="output folder (default: reports/<suite>, reports/<suite>-grid with --grid)")]
        = None,
    grid: GridOnlyOpt = False,
    figures: Annotated[bool, typer.Option(
        "--figures/--no-figures", help="draw the figures (PNG and SVG)")] = True,
    cache_dir: CacheOpt = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
) -> None:
    """Build the leaderboard report: Markdown, HTML, CSV, LaTeX and figures."""
    quiet_libraries()
    from harness.config.published import AnchorError
    from harness.reporting.report import build_report

    def shown(path: Path) -> str:  # the command in the report's header, relative when it can
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)

    try:
        # The suite as the runs were made: a grid run with --set plans its cells with it.
        config = load_suite(suite, recipe_overrides(set_, data_dir, teacher))
        # named by the suite's name, not by how it was given (a recipe file's path)
        target = out or contained(REPO_ROOT / "reports", config.name + ("-grid" if grid else ""))
        command = shlex.join(["harness", "report", "--suite", suite,
                              *(["--grid"] if grid else []),
                              *recipe_options(set_, data_dir, teacher),
                              "--results", shown(results), "--out", shown(target)])
        result = build_report(config, results, target, grid=grid, command=command,
                              cache_dir=cache_dir, figures=figures, log=echo)
    except (ConfigError, AnchorError, KeyError, FileNotFoundError, ValueError) as error:
        fail(error_text(error))
        return
    except OSError as error:  # an --out that is a file, or not writable
        fail(f"report: cannot write {error.filename or out}: {error.strerror or error}; "
             "pass a writable --out folder")
        return
    echo("")
    for line in result.summary:
        echo(line)
    echo(f"\nreport: {result.out / 'leaderboard.html'} ({len(result.files)} files, "
         f"{len(result.figures)} figures)")

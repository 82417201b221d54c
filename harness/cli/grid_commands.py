"""``harness grid`` and ``harness worker``: the suite's common grid, run here or pulled from
a storage that many workers share."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.shared import crashed, failed, interrupted, recipe_options, trackers, warn_unused
from harness.common.cli_options import (
    DEFAULT_RESULTS,
    STORAGE_PASSWORD_HELP,
    CacheOpt,
    DataDirOpt,
    GridMethodOpt,
    GridSeedsOpt,
    LogDirOpt,
    LogWithOpt,
    ParamsOpt,
    ResultsOpt,
    RetryFailedOpt,
    SetOpt,
    StorageOpt,
    SuiteOpt,
    TasksOpt,
    TeacherOpt,
    echo,
    quiet_libraries,
    recipe_overrides,
    split_csv,
)
from harness.config.schema import ConfigError, parse_seeds, resolve_suite_path
from harness.experiments.suites import check_method_names, load_suite


def grid(
    suite: SuiteOpt = "glue-cpu",
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="list the cells, their budgets and estimated cost; run nothing")]
        = False,
    storage: StorageOpt = None,
    method: GridMethodOpt = None,
    tasks: TasksOpt = None,
    seeds: GridSeedsOpt = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
    results: ResultsOpt = DEFAULT_RESULTS,
    cache_dir: CacheOpt = None,
    params: ParamsOpt = None,
    log_with: LogWithOpt = None,
    log_dir: LogDirOpt = None,
    retry_failed: RetryFailedOpt = False,
) -> None:
    """Run the suite's common grid (resumable: finished cells are skipped by config hash)."""
    _grid(suite, storage, results, cache_dir, method, tasks, seeds, set_, data_dir, teacher,
          dry_run, None, reclaim_local=True, params=params, log_with=log_with, log_dir=log_dir,
          retry_failed=retry_failed)


def worker(
    storage: Annotated[str, typer.Option(
        help="the Optuna storage every worker shares, e.g. postgresql+psycopg2://user@host/db"
        + STORAGE_PASSWORD_HELP)],
    suite: SuiteOpt = "glue-cpu",
    method: GridMethodOpt = None,
    tasks: TasksOpt = None,
    seeds: GridSeedsOpt = None,
    poll_seconds: Annotated[float | None, typer.Option(
        help="how often to look again while other workers' cells run")] = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
    results: ResultsOpt = DEFAULT_RESULTS,
    cache_dir: CacheOpt = None,
    params: ParamsOpt = None,
    log_with: LogWithOpt = None,
    log_dir: LogDirOpt = None,
) -> None:
    """Pull the grid's tuning trials and cells from a shared storage until none is left.
    Start one per machine (or per GPU); every worker must be given the same options."""
    _grid(suite, storage, results, cache_dir, method, tasks, seeds, set_, data_dir, teacher,
          False, poll_seconds, reclaim_local=False, params=params, log_with=log_with,
          log_dir=log_dir)


def _grid(suite: str, storage: str | None, results: Path, cache_dir: Path | None,
          method: list[str] | None, tasks: list[str] | None, seeds: list[str] | None,
          set_: list[str] | None, data_dir: str | None, teacher: str | None,
          dry_run: bool, poll_seconds: float | None, reclaim_local: bool,
          params: list[str] | None = None, log_with: list[str] | None = None,
          log_dir: Path | None = None, retry_failed: bool = False) -> None:
    quiet_libraries()
    from harness.experiments.grid import Grid
    from harness.experiments.storage import command_storage
    from harness.experiments.tuning import UnexpectedError, load_tuned

    try:
        tracking = trackers(log_with, log_dir, results)
        overrides = recipe_overrides(set_, data_dir, teacher)
        config = load_suite(suite, overrides)
        method = split_csv(method)
        check_method_names(config, method or [], "--method", str(resolve_suite_path(suite)))
        storage_url = command_storage(storage, results, check=not dry_run)  # a dry run uses none
        if config.grid is not None:
            warn_unused(suite, overrides, config, method or config.grid.recipes,
                         split_csv(tasks) or config.grid.tasks or config.tasks)
        grid = Grid(config, results, storage_url, cache_dir,
                    log=echo, methods=method, tasks=split_csv(tasks),
                    seeds=parse_seeds(seeds),
                    poll_seconds=poll_seconds, reclaim_local=reclaim_local,
                    tuned=[load_tuned(reference, results) for reference in params or []],
                    tracking=tracking, retry_failed=retry_failed)
        planned = grid.plan()
        if dry_run or grid.runner.accelerator.is_main_process:
            for line in grid.describe(planned):
                echo(line)
        if dry_run:
            return
        summary = grid.work()
    except UnexpectedError as error:
        crashed(error)
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        failed("grid", error)
    except KeyboardInterrupt as stopped:
        interrupted("grid", stopped)
    if not summary:
        return
    echo(f"\ngrid {grid.study_name}: {summary['complete']} of {summary['cells']} cells "
          f"complete, {summary['fail'] - summary['retried']} failed, {summary['retried']} "
          f"queued again (a worker died or was stopped)\nrecords: "
          f"{results / config.record_suite}; table: "
          f"{_grid_table_command(suite, results, set_, data_dir, teacher)}")
    if summary["complete"] < summary["cells"]:
        raise typer.Exit(1)


def _grid_table_command(suite: str, results: Path, set_: list[str] | None = None,
                        data_dir: str | None = None, teacher: str | None = None) -> str:
    """The `harness table` command that shows the grid just run: its cells (planned with the
    same --set, --data-dir and --teacher), in its store."""
    parts = ["harness", "table", "--suite", suite, "--grid",
             *recipe_options(set_, data_dir, teacher)]
    if results.resolve() != DEFAULT_RESULTS.resolve():
        parts += ["--results", str(results)]
    return shlex.join(parts)

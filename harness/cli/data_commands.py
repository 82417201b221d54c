"""``harness data``: check a local GLUE copy, or fetch one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.common.cli_options import (
    DataDirOpt,
    echo,
    error_text,
    fail,
    quiet_libraries,
    split_csv,
)

data_app = typer.Typer(no_args_is_help=True, help="GLUE data: check a local copy, or fetch one.")


@data_app.command("fetch")
def data_fetch(
    out: Annotated[Path, typer.Option(help="folder to write GLUE-style files into")],
    tasks: Annotated[str, typer.Option(help="comma-separated tasks")] =
        "cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli",
) -> None:
    """Download nyu-mll/glue from the hub into OUT for later offline use (needs internet)."""
    from harness.data.loading import fetch_glue
    from harness.data.tasks import get_task

    try:
        for task in split_csv(tasks) or []:
            get_task(task)  # a misspelt task is not a network problem
    except KeyError as error:
        fail(error_text(error))
    try:
        paths = fetch_glue(split_csv(tasks) or [], out)
    except Exception as error:  # network and hub errors come in many types
        fail(f"fetch failed: {error}. This needs internet access and HF_HUB_OFFLINE unset.")
        return
    for path in paths:
        echo(str(path))


@data_app.command("check")
def data_check(
    data_dir: DataDirOpt = None,
    tasks: Annotated[list[str] | None, typer.Option(
        help="tasks, comma-separated or repeated (default: every task folder found)")] = None,
) -> None:
    """Load and validate every split file of the tasks as a run reads them: rows per split,
    or every problem as file:line (exit status 1); a training file of a single class is a
    warning (it loads, but nothing trained on it learns the task)."""
    quiet_libraries()
    from harness.data.loading import DataNotFoundError, check_tasks

    try:
        root, checks = check_tasks(split_csv(tasks), data_dir)
    except (DataNotFoundError, KeyError) as error:
        fail(error_text(error))
        return
    echo(f"data: {root}")
    for check in checks:
        if check.errors:
            echo(f"{check.task:<6} FAILED")
            for line in check.errors:
                echo(f"  {line}")
            continue
        splits = "  ".join(f"{split} {rows} ({check.files.get(split, '?')}, "
                           f"{check.layouts.get(split, '?')})"
                           for split, rows in check.rows.items())
        echo(f"{check.task:<6} {splits}")
        for line in check.warnings:
            echo(f"  warning: {line}")
    failed = [check.task for check in checks if check.errors]
    warned = [check.task for check in checks if check.warnings]
    echo(f"{len(checks)} task(s) checked; " + (f"{len(failed)} with errors: "
                                               f"{', '.join(failed)}" if failed else "no errors")
         + (f"; warnings for {', '.join(warned)}" if warned else ""))
    if failed:
        raise typer.Exit(1)

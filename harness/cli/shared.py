"""What the command groups share: how a command fails, is stopped by Ctrl-C or crashes
(its one line and exit status), the recipe options of a printed command, the warning for an
unused ``--set``, and the ``--log-with`` trackers."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from harness.common.cli_options import echo, error_text, fail, log_dir_for, split_csv
from harness.common.interrupts import ctrl_c_pressed
from harness.experiments.suites import unused_assignments

if TYPE_CHECKING:
    from harness.config.schema import SuiteConfig
    from harness.experiments.tracking import Tracking
    from harness.experiments.tuning import UnexpectedError

# What gloo says in a process whose peer left in the middle of a collective.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
PEER_SIGNAL_WAIT = 3.0  # seconds: the launcher signals its processes one after another



def failed(command: str, error: BaseException) -> NoReturn:
    """``fail`` with the error's message.  Under `accelerate launch` a collective broken by
    a process that stopped first is most often a Ctrl-C: the launcher passes it to one
    process after another, and the first to stop breaks the collective the others are in.
    Such a process waits a moment for its own Ctrl-C, to report that instead."""
    if ctrl_c_pressed():  # and then a collective broke, or a swallowed one surfaced
        interrupted(command, KeyboardInterrupt())
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and any(
            text in str(error) for text in PEER_GONE):
        try:
            time.sleep(PEER_SIGNAL_WAIT)
        except KeyboardInterrupt as stopped:
            interrupted(command, stopped)
        fail(f"another process of this launch stopped first (its own lines say why): {error}")
    fail(error_text(error))


def interrupted(command: str, stopped: KeyboardInterrupt) -> NoReturn:
    """Ctrl-C: say in one line what it stopped and that the same command resumes, then
    exit 130 (a shell's status for SIGINT). The stopped run has no record (a record is
    written when a run finishes or fails), so the command trains it again and skips the
    runs recorded before; a stopped trial or grid cell is queued again."""
    from harness.experiments.grid import GridInterrupted
    from harness.experiments.tuning import TuningInterrupted

    if isinstance(stopped, TuningInterrupted):  # in a study's trial (tune, or a grid's budget)
        queued = (f"trial {stopped.trial}'s parameters are queued again; "
                  if stopped.trial is not None else "")
        what = f"{queued}the same command resumes the study {stopped.study}"
    elif isinstance(stopped, GridInterrupted):
        what = (f"cell {stopped.cell} (trial {stopped.trial}) is not recorded; the same "
                f"command queues it again and resumes the grid {stopped.study}")
    elif command == "tune":
        what = "the same command resumes the study"
    else:
        what = ("the run in progress is not recorded; the same command skips the recorded "
                "runs and trains it again")
    echo(f"[{command}] interrupted (Ctrl-C): {what}")
    raise typer.Exit(130) from None



def crashed(error: UnexpectedError) -> NoReturn:
    """A bug stopped a trial or a grid cell: its traceback (the only one printed), then what
    it stopped and how the same command resumes, and exit 1."""
    import traceback

    cause = error.__cause__ if error.__cause__ is not None else error
    typer.echo("".join(traceback.format_exception(cause)).rstrip(), err=True)
    typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
    raise typer.Exit(1)



def trackers(log_with: list[str] | None, log_dir: Path | None, results: Path
              ) -> Tracking | None:
    """The checked ``--log-with`` trackers (None: none); an unknown name or a missing
    package is an error before anything runs."""
    from harness.experiments.tracking import Tracking

    return Tracking.of(split_csv(log_with), log_dir_for(log_dir, results))



def warn_unused(suite: str, overrides: list[str], config: SuiteConfig, methods: list[str],
                 tasks: list[str]) -> None:
    """Warn about each ``--set`` that changes none of the runs (see ``unused_assignments``)."""
    for line in unused_assignments(suite, overrides, config, methods, tasks):
        echo(f"warning: {line}")



def recipe_options(set_: list[str] | None, data_dir: str | None, teacher: str | None
                    ) -> list[str]:
    """``--set``, ``--data-dir`` and ``--teacher`` as given, for a printed command."""
    options = [part for assignment in set_ or [] for part in ("--set", assignment)]
    if data_dir:
        options += ["--data-dir", data_dir]
    if teacher:
        options += ["--teacher", teacher]
    return options

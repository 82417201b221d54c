"""The ``harness`` command line: the typer app, with one module per command group.

==============================  ==================================
``run``, ``teacher``            :mod:`harness.cli.run_commands`
``tune``                        :mod:`harness.cli.tune_commands`
``grid``, ``worker``            :mod:`harness.cli.grid_commands`
``table``, ``report``           :mod:`harness.cli.report_commands`
``list``, ``new-method``        :mod:`harness.cli.method_commands`
``export``                      :mod:`harness.cli.export_commands`
``data check``, ``data fetch``  :mod:`harness.cli.data_commands`
``bench``                       :mod:`harness.cli.bench_commands`
==============================  ==================================

The options several commands share are defined once, in :mod:`harness.common.cli_options`;
how a command fails or is stopped is :mod:`harness.cli.shared`. ``python -m harness.cli``
runs it from a checkout, as the ``harness`` script does once installed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import typer

from harness.cli import (
    export_commands,
    grid_commands,
    method_commands,
    report_commands,
    run_commands,
    tune_commands,
)
from harness.cli.bench_commands import bench_app
from harness.cli.data_commands import data_app
from harness.common.interrupts import catching_ctrl_c

__all__ = ["app"]

app = typer.Typer(add_completion=False, no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(bench_app, name="bench")


@app.callback(help="Benchmark and ablation harness for knowledge distillation on GLUE.")
def _every_command(context: typer.Context) -> None:
    # A Ctrl-C that Python swallows still stops training at its next step
    # (harness.common.interrupts); the handler is the default one again after the command.
    context.with_resource(catching_ctrl_c())


app.command()(run_commands.run)
app.command()(tune_commands.tune)
app.command()(grid_commands.grid)
app.command()(grid_commands.worker)
app.command()(run_commands.teacher)
app.command()(report_commands.table)
app.command()(report_commands.report)
app.command("list")(method_commands.list_)
app.command("new-method")(method_commands.new_method)
app.command()(export_commands.export)

"""``harness tune``: an Optuna study of one method on one task, and the command that runs
its best parameters."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.shared import crashed, failed, interrupted, trackers, warn_unused
from harness.common.cli_options import (
    DEFAULT_RESULTS,
    CacheOpt,
    DataDirOpt,
    LogDirOpt,
    LogWithOpt,
    ResultsOpt,
    SetOpt,
    StorageOpt,
    SuiteOpt,
    TeacherOpt,
    echo,
    fail,
    quiet_libraries,
    recipe_overrides,
)
from harness.config.schema import ConfigError, parse_seeds, resolve_suite_path
from harness.experiments.suites import check_method_names, load_suite


def tune(
    method: Annotated[str, typer.Option("--method", "-m", help="method or variant to tune")],
    task: Annotated[str, typer.Option(help="task whose dev main metric is the objective")],
    trials: Annotated[int, typer.Option(
        min=1, help="finished (complete or pruned) trials the study should reach")] = 20,
    suite: SuiteOpt = "glue-cpu",
    seeds: Annotated[list[str] | None, typer.Option(
        help="seeds each trial averages over (default: the suite's first)")] = None,
    storage: StorageOpt = None,
    pruner: Annotated[str, typer.Option(help="median, halving or none")] = "median",
    student: Annotated[str | None, typer.Option(
        help="tune on this suite student shape instead of the method's own")] = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
    results: ResultsOpt = DEFAULT_RESULTS,
    cache_dir: CacheOpt = None,
    log_with: LogWithOpt = None,
    log_dir: LogDirOpt = None,
) -> None:
    """Create or resume the Optuna study of METHOD on TASK; write its best parameters."""
    quiet_libraries()
    from harness.experiments.storage import command_storage
    from harness.experiments.tuning import Tuner, TuningTarget, UnexpectedError

    if pruner not in {"median", "halving", "none"}:
        fail(f"--pruner {pruner!r}: choose median, halving or none")
    try:
        tracking = trackers(log_with, log_dir, results)
        overrides = recipe_overrides(set_, data_dir, teacher)
        config = load_suite(suite, overrides)
        check_method_names(config, [method], "--method", str(resolve_suite_path(suite)))
        storage_url = command_storage(storage, results)
        warn_unused(suite, overrides, config, [method], [task])
        seed_list = parse_seeds(seeds) or config.seeds[:1]
        target = TuningTarget(method=method, task=task, seeds=seed_list, student=student)
        tuner = Tuner(config, target, results, storage_url, cache_dir,
                      pruner=pruner, log=echo, tracking=tracking)
        tuner.optimize(trials)
        if not tuner.runner.accelerator.is_main_process:
            return
        path = tuner.write_best()
    except UnexpectedError as error:
        crashed(error)
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        failed("tune", error)
    except KeyboardInterrupt as stopped:
        interrupted("tune", stopped)
    _print_study(tuner)
    use = _run_params_command(suite, method, task, tuner.name, set_, data_dir, teacher,
                              results, cache_dir)
    echo(f"\nbest parameters: {path}\nuse them: {use}")


def _run_params_command(suite: str, method: str, task: str, study: str,
                        set_: list[str] | None, data_dir: str | None, teacher: str | None,
                        results: Path, cache_dir: Path | None) -> str:
    """The `harness run --params` command that applies a study's parameters, with the
    options `tune` was given that it needs to work as printed: the store that holds the
    parameter file (a study name is looked up under its ``tuned/``), and the recipe,
    data, teacher and cache the study tuned with."""
    parts = ["harness", "run", "--suite", suite, "--method", method, "--tasks", task]
    for assignment in set_ or []:
        parts += ["--set", assignment]
    if data_dir is not None:
        parts += ["--data-dir", data_dir]
    if teacher is not None:
        parts += ["--teacher", teacher]
    if results.resolve() != DEFAULT_RESULTS.resolve():
        parts += ["--results", str(results)]
    if cache_dir is not None:
        parts += ["--cache-dir", str(cache_dir)]
    return shlex.join([*parts, "--params", study])


def _print_study(tuner) -> None:
    study = tuner.study()
    echo(f"\n{'trial':>5} {'state':<9} {'value':>7} {'evals':>5}  parameters")
    for trial in study.get_trials(deepcopy=False):
        value = f"{trial.value:7.2f}" if trial.value is not None else "      -"
        shown = ", ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                          for key, value in trial.params.items())
        recipe = "  (the recipe's own)" if trial.user_attrs.get("recipe") else ""
        echo(f"{trial.number:>5} {trial.state.name.lower():<9} {value} "
              f"{len(trial.intermediate_values):>5}  {shown}{recipe}")
    best = study.best_trial
    echo(f"best: trial {best.number}, {best.value:.2f} "
          f"(seeds {best.user_attrs.get('scores')})")

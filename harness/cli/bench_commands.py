"""``harness bench``: model efficiency of a suite's teacher and students."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.common.cli_options import (
    DEFAULT_RESULTS,
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
from harness.config.schema import ConfigError
from harness.experiments.suites import load_suite

bench_app = typer.Typer(
    invoke_without_command=True,
    help="Model efficiency: parameters, FLOPs, latency and throughput of the teacher and "
    "every student shape on this device.  The harness's own benchmarks (training step, "
    "memory, threads, teacher precision, augmentation) are `python -m benchmarks`.")


@bench_app.callback()
def bench_models(
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
    precision: Annotated[str, typer.Option(
        help="fp32, bf16 (autocast) or auto (bf16 where the device computes it natively)")]
        = "fp32",
    set_: SetOpt = None,
) -> None:
    """Measure the teacher and every student shape; one record in <results>/bench/<suite>/."""
    quiet_libraries()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from harness.bench.efficiency import BenchSettings, paper_lines, run_bench, summary_table

    try:
        lengths = tuple(int(item) for item in split_csv(seq_lengths) or [])
    except ValueError:
        fail(f"--seq-lengths {seq_lengths!r}: expected integers, e.g. 64,128")
        return
    try:
        config = load_suite(suite, recipe_overrides(set_, None, teacher))
        settings = BenchSettings(
            seq_lengths=lengths, latency_batch=latency_batch, throughput_batch=throughput_batch,
            warmup=warmup, repeats=repeats, min_seconds=min_seconds,
            random_weights=random_weights, bilstm_vocab=bilstm_vocab, device=device,
            threads=threads, precision=precision)
        record, path = run_bench(config, settings, results, split_csv(student), log=echo)
    except (ConfigError, KeyError, FileNotFoundError, OSError, RuntimeError,
            ValueError) as error:
        fail(error_text(error))
        return
    machine = record["machine"]
    echo(f"\n{config.name} on {machine['host']}: {machine['device']} "
          f"({machine['device_name']}), {machine['threads']} thread(s), torch "
          f"{machine['torch']}, {record['settings']['precision']}, "
          f"{'random' if random_weights else 'checkpoint'} teacher weights")
    for line in summary_table(record):
        echo(line)
    comparison = paper_lines(record)
    if comparison:
        echo("")
        for line in comparison:
            echo(line)
    echo(f"\nrecord: {path}")

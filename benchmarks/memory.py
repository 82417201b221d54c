"""Run-level benchmarks: memory across runs in one process, the teacher cache's payoff, and
the wall time and peak memory of each method's glue-cpu runs.

- :func:`run_memory_flatness` (``python -m benchmarks memory``): many runs in ONE process (rounds
  of methods x tasks, one seed per round) on the cached teachers with a small step budget;
  after each run the process's resident memory (after ``gc.collect()``), the run's own
  peak (its record's ``memory``) and the live torch tensors and modules.  A leak shows as
  a rising line from round to round; the fitted slope (MiB per run, rounds after the
  first) says how much.  CSV plus a figure (PNG and SVG).
- :func:`run_cache_benchmark` (``python -m benchmarks cache``): on a fresh cache and results
  store, the first run of a task (fine-tunes the teacher, labels its training and dev
  splits, trains the student) against later runs that reuse the cached teacher: another
  seed, another logit-only method, an Optuna trial.  Each step is its own ``harness`` process, timed
  from the outside, as a user would run it.
- :func:`method_costs` (``python -m benchmarks runs``): per method, the wall time of a full seed
  (sum over the suite's tasks) from the records, and peak memory from records that carry
  one.
"""

from __future__ import annotations

import csv
import gc
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.files import atomic_path, write_text_atomic
from harness.common.process_memory import rss_mb
from harness.experiments.record import RunRecord
from harness.experiments.store import ResultsStore

TARGET_CACHE_RATIO = 0.5
"""The benchmark's target: a second method, seed or trial on an already-cached task costs at
most half of the first's wall time (logit-only methods)."""


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def fit_slope(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of ``y`` on ``x`` (None with fewer than two points)."""
    if len(x) < 2 or len(set(x)) < 2:
        return None
    return float(np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)[0])


def live_torch_objects() -> dict[str, float]:
    """Live tensors (count and MiB, storages counted once) and nn.Modules, from the
    garbage collector's view: what a leak of models, optimisers or activations leaves."""
    import torch

    tensors = modules = 0
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                tensors += 1
                if obj.device.type == "cpu" and not obj.is_meta:
                    storage = obj.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
            elif isinstance(obj, torch.nn.Module):
                modules += 1
        except (ReferenceError, RuntimeError):  # weak proxies, exotic tensor subclasses
            continue
    return {"live_tensors": tensors, "live_tensor_mb": sum(storages.values()) / 2**20,
            "live_modules": modules}


# --------------------------------------------------------------------------- memory flatness


@dataclass
class FlatnessResult:
    rows: list[dict[str, Any]]
    slope_mb_per_run: float | None
    """Slope of RSS after each run (after gc) over the runs of every round but the first."""
    peak_slope_mb_per_run: float | None
    round_end_rss_mb: list[float]
    csv_path: Path | None
    figures: list[Path]
    table: list[str]


def run_memory_flatness(*, suite: str, methods: Sequence[str], tasks: Sequence[str],
                        seeds: Sequence[int], max_steps: int, overrides: Sequence[str] = (),
                        results_dir: Path | None = None, cache_dir: Path | None = None,
                        csv_path: Path | None = None, figure_path: Path | None = None,
                        inference_seconds: float = 0.2, title: str | None = None,
                        release: bool = True,
                        log: Callable[[str], None] = print) -> FlatnessResult:
    """Rounds of runs in this process, one seed per round: every (task, method) of the
    round, each with at most ``max_steps`` optimiser steps per stage.  Teachers and
    augmented copies come from the cache (these budgets are not in their keys; general
    distillation's key does hold its budget, so methods with corpus stages would train
    and cache a short general stage: leave them out).  ``release``: whether the runner
    trims the heap after each run (:func:`harness.common.process_memory.release_freed_memory`)."""
    import harness.common.process_memory as memory_module
    import harness.experiments.runner as runner_module
    from harness.experiments.suites import load_suite

    config = load_suite(suite, [*overrides, f"training.max_steps={max_steps}"])
    results_dir = Path(results_dir or tempfile.mkdtemp(prefix="bench-memory-"))
    log(f"[memory] {len(seeds)} rounds x {len(tasks)} tasks x {len(methods)} methods = "
        f"{len(seeds) * len(tasks) * len(methods)} runs in one process (pid {os.getpid()}); "
        f"max_steps {max_steps} per stage; records in {results_dir}")
    saved_seconds, saved_release = runner_module.INFERENCE_SECONDS, memory_module.RELEASE
    runner_module.INFERENCE_SECONDS = inference_seconds
    memory_module.RELEASE = release
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        runner = runner_module.SuiteRunner(config, results_dir, cache_dir, log=_quiet(log))
        gc.collect()
        baseline = rss_mb()
        log(f"[memory] RSS before the first run: {baseline:.0f} MiB")
        index = 0
        for round_index, seed in enumerate(seeds):
            for task in tasks:
                for method in methods:
                    clock = time.perf_counter()
                    outcome = runner.run_one(method, task, seed)
                    seconds = time.perf_counter() - clock
                    record = runner.store.load(outcome.path) if outcome.path else None
                    memory = (record.memory if record else None) or {}
                    end = rss_mb()
                    gc.collect()
                    row = {"run": index, "round": round_index, "seed": seed, "task": task,
                           "method": method, "status": outcome.status,
                           "seconds": round(seconds, 1),
                           "peak_rss_mb": memory.get("peak_rss_mb"),
                           "rss_start_mb": memory.get("rss_start_mb"),
                           "rss_end_mb": round(end, 1) if end is not None else None,
                           "rss_after_gc_mb": _round(rss_mb()),
                           **{k: round(v, 1) if isinstance(v, float) else v
                              for k, v in live_torch_objects().items()}}
                    row["heap_trim"] = release
                    rows.append(row)
                    log(f"[memory] run {index:>3} round {round_index} {method:<14} {task:<5} "
                        f"seed {seed}: {outcome.status}, {seconds:5.1f}s, peak "
                        f"{row['peak_rss_mb']} MiB, after {row['rss_after_gc_mb']} MiB, "
                        f"{row['live_tensors']} tensors ({row['live_tensor_mb']} MiB), "
                        f"{row['live_modules']} modules")
                    index += 1
    finally:
        runner_module.INFERENCE_SECONDS = saved_seconds
        memory_module.RELEASE = saved_release
    slope, peak_slope = flatness_slopes(rows)
    round_end = [rows[i]["rss_after_gc_mb"] for i in range(len(rows))
                 if i == len(rows) - 1 or rows[i + 1]["round"] != rows[i]["round"]]
    figures: list[Path] = []
    if csv_path is not None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(csv_path, text.getvalue())
    if figure_path is not None:
        figures = plot_memory_flatness([(title or _mode_title(release), rows)], figure_path)
    table = [
        f"{_mode_title(release)}: "
        f"{len(rows)} runs in one process in {time.perf_counter() - started:.0f}s "
        f"({len(seeds)} rounds of {len(tasks)} tasks x {len(methods)} methods; "
        f"max_steps {max_steps}); load average {_load_text()}",
        "RSS after each round (after gc): "
        + ", ".join(f"{value:.0f}" for value in round_end) + " MiB",
        f"slope of RSS after each run, rounds 2+: {_slope_text(slope)}; of per-run peak "
        f"RSS: {_slope_text(peak_slope)}",
        "the same over the second half of the rounds (rounds "
        f"{len(seeds) // 2 + 1}+): "
        + "; ".join(_slope_text(value) for value in flatness_slopes(rows, len(seeds) // 2)),
        "live torch tensors after each round: "
        + ", ".join(str(rows[i]["live_tensors"]) for i in range(len(rows))
                    if i == len(rows) - 1 or rows[i + 1]["round"] != rows[i]["round"]),
    ]
    if csv_path is not None:
        table.append(f"csv: {csv_path}")
    table.extend(f"figure: {path}" for path in figures)
    return FlatnessResult(rows, slope, peak_slope, round_end, csv_path, figures, table)


def _quiet(log: Callable[[str], None]) -> Callable[[str], None]:
    """The runner's log without its per-run chatter (the bench prints its own line)."""
    def filtered(message: str) -> None:
        if message.startswith(("[teacher]", "[general]", "[augment", "[mlm]", "[failed]")):
            log(message)
    return filtered


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


def _slope_text(slope: float | None) -> str:
    return f"{slope:+.2f} MiB per run" if slope is not None else "n/a"


def _load_text() -> str:
    load = load_average()
    return ", ".join(f"{value:.2f}" for value in load) if load else "n/a"


def _mode_title(release: bool) -> str:
    return ("after: gc.collect() + malloc_trim(0) after each run" if release else
            "before: gc.collect() only (HARNESS_RELEASE_MEMORY=0)")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`run_memory_flatness`, numbers parsed."""
    rows = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            parsed: dict[str, Any] = {}
            for key, value in row.items():
                try:
                    parsed[key] = int(value)
                except ValueError:
                    try:
                        parsed[key] = float(value)
                    except ValueError:
                        parsed[key] = value
            rows.append(parsed)
    return rows


def flatness_slopes(rows: Sequence[dict[str, Any]], first_round: int = 1
                    ) -> tuple[float | None, float | None]:
    """(RSS after each run, per-run peak) slopes over the runs of rounds ``first_round``
    on (0-based; default: all but the first), in MiB per run."""
    later = [row for row in rows if row["round"] >= first_round]
    return (fit_slope([r["run"] for r in later], [r["rss_after_gc_mb"] for r in later]),
            fit_slope([r["run"] for r in later], [r["peak_rss_mb"] for r in later]))


def plot_memory_flatness(panels: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: Path,
                         suptitle: str | None = None) -> list[Path]:
    """Per panel (title, rows): RSS after each run and each run's peak against the run
    index, with the fitted slopes of rounds 2+; one PNG and one SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    everything = [row for _, rows in panels for row in rows]
    top = max(max(r["peak_rss_mb"] for r in everything),
              max(r["rss_after_gc_mb"] for r in everything))
    methods = list(dict.fromkeys(row["method"] for row in everything))
    markers = dict(zip(methods, "osD^vP*X", strict=False))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.9), sharey=True,
                             constrained_layout=True, squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels, strict=True):
        slope, peak_slope = flatness_slopes(rows)
        runs = [row["run"] for row in rows]
        ax.plot(runs, [row["peak_rss_mb"] for row in rows], color="#c44e52", lw=1, alpha=0.5)
        ax.plot(runs, [row["rss_after_gc_mb"] for row in rows], color="#4c72b0", lw=1,
                alpha=0.5)
        for method in methods:
            mine = [row for row in rows if row["method"] == method]
            ax.scatter([r["run"] for r in mine], [r["peak_rss_mb"] for r in mine],
                       color="#c44e52", marker=markers[method], s=26, zorder=3)
            ax.scatter([r["run"] for r in mine], [r["rss_after_gc_mb"] for r in mine],
                       color="#4c72b0", marker=markers[method], s=26, zorder=3)
        later = [row for row in rows if row["round"] > 0]
        for column, value_slope, color, name in (
                ("peak_rss_mb", peak_slope, "#c44e52", "peak"),
                ("rss_after_gc_mb", slope, "#4c72b0", "after")):
            if value_slope is None:
                continue
            x = np.array([r["run"] for r in later], float)
            fit = np.polyfit(x, [r[column] for r in later], 1)
            ax.plot(x, np.polyval(fit, x), color=color, ls="--", lw=1.2)
            ax.annotate(f"{name}: {value_slope:+.1f} MiB/run", (x[-1], np.polyval(fit, x[-1])),
                        xytext=(4, 6 if name == "peak" else -12), textcoords="offset points",
                        fontsize=8, color=color, ha="right")
        for previous, row in itertools.pairwise(rows):
            if row["round"] != previous["round"]:
                ax.axvline(row["run"] - 0.5, color="grey", lw=0.8, ls=":")
        for round_index in sorted({row["round"] for row in rows}):
            mine = [row["run"] for row in rows if row["round"] == round_index]
            seed = next(row["seed"] for row in rows if row["round"] == round_index)
            ax.text((min(mine) + max(mine)) / 2, top * 1.03, f"seed {seed}", ha="center",
                    va="bottom", fontsize=8, color="grey")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("run index in one process (each round: every task x method, one seed)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylim(0, top * 1.12)
    axes[0][0].set_ylabel("resident memory, RSS (MiB)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="#c44e52", marker="o", ls="-",
                      label="peak RSS during the run (VmHWM, reset at its start)"),
               Line2D([], [], color="#4c72b0", marker="o", ls="-",
                      label="RSS after the run"),
               Line2D([], [], color="black", ls="--", label="least-squares fit, rounds 2+"),
               *[Line2D([], [], color="grey", marker=markers[m], ls="", label=m)
                 for m in methods]]
    fig.legend(handles=handles, loc="outside lower center",
               ncol=min(4 if len(panels) > 1 else 2, len(handles)),
               fontsize=8, frameon=False)
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    outputs = [path.with_suffix(".png"), path.with_suffix(".svg")]
    for output in outputs:
        with atomic_path(output) as temporary:
            fig.savefig(temporary, dpi=150)
    plt.close(fig)
    return outputs


# ------------------------------------------------------------------------------ cache bench


@dataclass
class CacheStep:
    label: str
    args: list[str]
    kind: str  # "run" or "tune"
    method: str
    seed: int


def run_cache_benchmark(*, task: str, train_examples: int | None, suite: str = "glue-cpu",
                        extra_sets: Sequence[str] = (), data_dir: str | None = None,
                        work_dir: Path | None = None, trial: bool = True,
                        log: Callable[[str], None] = print) -> dict[str, Any]:
    """First run of ``task`` (fresh cache: teacher fine-tuned and its logits computed) vs
    runs that reuse the cache; each a separate ``harness`` process timed from outside."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    cache, results = work / "cache", work / "results"
    if (cache / "teachers").exists() and any((cache / "teachers").iterdir()):
        raise ValueError(f"{cache} already holds a teacher: the first run must find none")
    sets = [*extra_sets]
    if train_examples is not None:
        sets.append(f"data.max_train_examples.{task}={train_examples}")
    common = ["--suite", suite, "--results", str(results), "--cache-dir", str(cache)]
    for assignment in sets:
        common += ["--set", assignment]
    if data_dir:
        common += ["--data-dir", data_dir]
    steps = [
        CacheStep("first: kd seed 1 (fine-tunes the teacher)",
                  ["run", "--method", "kd", "--tasks", task, "--seeds", "1"], "run", "kd", 1),
        CacheStep("kd seed 2 (another seed)",
                  ["run", "--method", "kd", "--tasks", task, "--seeds", "2"], "run", "kd", 2),
        CacheStep("finetune seed 1 (another method)",
                  ["run", "--method", "finetune", "--tasks", task, "--seeds", "1"], "run",
                  "finetune", 1),
    ]
    if trial:
        steps.append(CacheStep("kd Optuna trial (harness tune, 1 trial)",
                               ["tune", "--method", "kd", "--task", task, "--trials", "1",
                                "--seeds", "1"], "tune", "kd", 1))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    measured = []
    load_before = load_average()
    for number, step in enumerate(steps, start=1):
        command = [sys.executable, "-m", "harness.cli", *step.args, *common]
        log(f"[cache] {number}/{len(steps)} {step.label}: harness {' '.join(step.args)}")
        clock = time.perf_counter()
        with open(work / f"step{number}.log", "w") as output:
            completed = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT,
                                       env=env, check=False)
        seconds = time.perf_counter() - clock
        if completed.returncode != 0:
            raise RuntimeError(f"step {number} ({step.label}) failed with exit code "
                               f"{completed.returncode}; log: {work / f'step{number}.log'}")
        record = _step_record(results, step, task)
        measured.append({"label": step.label, "command": " ".join(step.args),
                         "seconds": seconds, "record": record})
        log(f"[cache]   {seconds:.1f}s")
    teacher = _teacher_summary(cache)
    first = measured[0]["seconds"]
    rows = []
    for number, step in enumerate(measured):
        record: RunRecord | None = step["record"]
        rows.append({
            "step": step["label"], "seconds": step["seconds"],
            "ratio": step["seconds"] / first if number else None,
            "pass": (step["seconds"] / first <= TARGET_CACHE_RATIO) if number else None,
            "record_wall_seconds": record.wall_seconds if record else None,
            "train_seconds": record.train_seconds if record else None,
            "steps": sum(stage.steps for stage in record.stages) if record else 0,
            "examples_seen": record.examples_seen if record else 0,
            "train_examples": record.data.train_examples if record else None,
            "peak_rss_mb": record.peak_rss_mb if record else None,
        })
    breakdown = _first_run_breakdown(measured[0], teacher)
    result = {"task": task, "train_examples": train_examples, "work_dir": str(work),
              "load_average_before": load_before, "load_average_after": load_average(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "rows": rows, "teacher": teacher, "first_breakdown": breakdown,
              "target": TARGET_CACHE_RATIO}
    result["table"] = cache_table(result)
    return result


def _step_record(results: Path, step: CacheStep, task: str) -> RunRecord | None:
    """The record a step made: the newest of its method, task and seed in its store."""
    root = results / "tuning" if step.kind == "tune" else results
    store = ResultsStore(root)
    found = []
    for path in root.glob(f"**/{step.method}/{task}/*.json"):
        if step.kind == "run" and path.relative_to(results).parts[0] == "tuning":
            continue
        record = store.load(path)
        if record.seed == step.seed:
            found.append((path.stat().st_mtime, record))
    return max(found, key=lambda item: item[0])[1] if found else None


def _teacher_summary(cache: Path) -> dict[str, Any]:
    entries = [path for path in (cache / "teachers").iterdir()
               if (path / "COMPLETE").exists()] if (cache / "teachers").exists() else []
    if len(entries) != 1:
        return {}
    summary = json.loads((entries[0] / "summary.json").read_text())
    stage = summary.get("stage") or {}
    return {"seconds": summary.get("seconds"), "finetune_seconds": stage.get("seconds"),
            "finetune_steps": stage.get("steps"),
            "finetune_examples": stage.get("examples_seen"),
            "epochs": (summary.get("training") or {}).get("epochs")}


def _first_run_breakdown(first: dict[str, Any], teacher: dict[str, Any]) -> dict[str, Any]:
    """Where the first run's time went: teacher fine-tuning (its training stage), teacher
    logits on its training and dev splits (the rest of the teacher build: load, labelling,
    save), the student's run (the record's wall time: training, dev evaluation, inference
    timing), and the rest (process start, imports, data loading and tokenisation)."""
    record: RunRecord | None = first["record"]
    finetune = teacher.get("finetune_seconds") or 0.0
    teacher_total = teacher.get("seconds") or 0.0
    run = (record.wall_seconds if record else None) or 0.0
    train = (record.train_seconds if record else None) or 0.0
    return {"total": first["seconds"], "teacher_finetune": finetune,
            "teacher_logits_and_save": max(0.0, teacher_total - finetune),
            "student_training": train, "student_eval_and_inference_timing": max(0.0, run - train),
            "process_data_and_rest": max(0.0, first["seconds"] - teacher_total - run)}


def cache_table(result: dict[str, Any]) -> list[str]:
    lines = [f"task {result['task']}, {result['train_examples'] or 'all'} training rows; "
             f"fresh cache and results in {result['work_dir']}; {result['date']}; load "
             f"average before {_fmt_load(result['load_average_before'])}, after "
             f"{_fmt_load(result['load_average_after'])}",
             f"{'step':<44} {'wall s':>7} {'vs first':>8} {'target':>7} {'run s':>6} "
             f"{'train s':>7} {'steps':>5} {'examples':>8} {'peak MiB':>8}"]
    for row in result["rows"]:
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "1"
        verdict = ("PASS" if row["pass"] else "MISS") if row["pass"] is not None else ""
        lines.append(f"{row['step']:<44} {row['seconds']:7.1f} {ratio:>8} {verdict:>7} "
                     f"{_num(row['record_wall_seconds'], 6)} {_num(row['train_seconds'], 7)} "
                     f"{row['steps']:>5} {row['examples_seen']:>8} "
                     f"{_num(row['peak_rss_mb'], 8, 0)}")
    b = result["first_breakdown"]
    teacher = result["teacher"]
    lines.append(
        f"first run {b['total']:.1f}s = teacher fine-tuning {b['teacher_finetune']:.1f}s "
        f"({teacher.get('finetune_steps')} steps, {teacher.get('finetune_examples')} examples) "
        f"+ teacher logits on the training and dev splits and save "
        f"{b['teacher_logits_and_save']:.1f}s + "
        f"student training {b['student_training']:.1f}s + student dev evaluation and "
        f"inference timing {b['student_eval_and_inference_timing']:.1f}s + process start, "
        f"imports, data and the rest {b['process_data_and_rest']:.1f}s")
    lines.append(f"target: every later step <= {result['target']}x the first's wall time")
    return lines


def _fmt_load(load: Sequence[float] | None) -> str:
    return "/".join(f"{value:.2f}" for value in load) if load else "n/a"


def _num(value: float | None, width: int, digits: int = 1) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


# ----------------------------------------------------------------------------- method costs


def method_costs(results: Path, suite_name: str, memory_results: Sequence[Path] = (),
                 methods: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Per method: a full seed's wall time (sum of ``wall_seconds`` over the suite's tasks;
    seeds with every task finished, plain runs only: no grid budget, no tuned values) from
    ``results``, and the highest peak RSS of the records carrying ``memory`` in
    ``memory_results`` (and ``results``), with that run's task and minutes."""
    from harness.experiments.suites import load_suite

    suite = load_suite(suite_name)
    tasks = suite.tasks
    walls: dict[str, dict[int, dict[str, float]]] = {}
    for record in ResultsStore(results / suite.record_suite).records():
        if not record.finished or record.variation or record.tuned or \
                record.task not in tasks or record.wall_seconds is None:
            continue
        walls.setdefault(record.method, {}).setdefault(record.seed, {})[
            record.task] = record.wall_seconds
    peaks: dict[str, list[tuple[str, float, float]]] = {}
    for root in [*memory_results, results]:
        store = ResultsStore(root / suite.record_suite if (root / suite.record_suite).exists()
                             else root)
        for record in store.records():
            if record.finished and record.peak_rss_mb is not None:
                peaks.setdefault(record.method, []).append(
                    (record.task, record.peak_rss_mb, record.wall_seconds or 0.0))
    def complete(name: str) -> bool:
        return any(set(by_task) >= set(tasks) for by_task in walls.get(name, {}).values())

    names = list(methods or [name for name in dict.fromkeys([*walls, *peaks])
                             if complete(name) or name in peaks])
    rows = []
    for name in names:
        seeds = {seed: sum(by_task.values()) for seed, by_task in walls.get(name, {}).items()
                 if set(by_task) >= set(tasks)}
        per_seed = sorted(seeds.values())
        peak = peaks.get(name, [])
        top = max(peak, key=lambda measured: measured[1]) if peak else None  # the peak's run
        rows.append({
            "method": name, "complete_seeds": len(per_seed),
            "seed_minutes_mean": np.mean(per_seed) / 60 if per_seed else None,
            "seed_minutes_median": np.median(per_seed) / 60 if per_seed else None,
            "seed_minutes_min": per_seed[0] / 60 if per_seed else None,
            "seed_minutes_max": per_seed[-1] / 60 if per_seed else None,
            "peak_rss_mb": top[1] if top else None,
            "peak_tasks": [top[0]] if top else [],
            "peak_run_minutes": top[2] / 60 if top else None,
        })
    lines = [f"{suite_name}: wall time of one seed over {len(tasks)} tasks "
             f"({', '.join(tasks)}) from {results / suite.record_suite} (records' "
             f"wall_seconds: from the cached teacher to the record; a seed that made a "
             f"one-off, general distillation or augmented copies, includes it); peak RSS "
             f"from records with a memory field",
             f"{'method':<22} {'seeds':>5} {'min/seed median':>15} {'range':>11} "
             f"{'peak RSS MiB':>12} {'measured on':>12} {'that run min':>12}"]
    for row in rows:
        spread = (f"{row['seed_minutes_min']:.1f}-{row['seed_minutes_max']:.1f}"
                  if row["complete_seeds"] else "-")
        lines.append(
            f"{row['method']:<22} {row['complete_seeds']:>5} "
            f"{_num(row['seed_minutes_median'], 15)} {spread:>11} "
            f"{_num(row['peak_rss_mb'], 12, 0)} "
            f"{','.join(row['peak_tasks']) or 'not measured':>12} "
            f"{_num(row['peak_run_minutes'], 12)}")
    return rows, lines

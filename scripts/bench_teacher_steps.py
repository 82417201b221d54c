"""Step timings behind the teacher-output and student-compilation defaults.

Real training steps of the glue-cpu suite on real task rows (MRPC by default), through
``harness.training.engine.train_stage`` itself, with the cached fine-tuned MiniLM teacher:

* ``layers``: the live teacher forward of a stage, whole (every layer, pooler and
  classifier: what the engine did before methods declared their layers) against stopped
  after the deepest layer the method reads: TinyBERT's intermediate stage (glue-cpu
  mapping [2, 3, 5, 6]; the 'bottom' ablation [1, 2, 3, 4]) and BERT-PKD (layers 2, 4);
* ``cache``: TinyBERT's intermediate stage with a live teacher against the fp16 disk
  cache (teacher.intermediate_cache), plus the cache's build time and size;
* ``student``: a 4L-192 kd step and a TinyBERT intermediate step (cached teacher) in
  fp32, bf16 autocast and with torch.compile (compile time reported apart).

A step's time is the interval between consecutive loss computations (teacher outputs,
student forward and loss, backward, optimiser step, next batch); the median over the
timed steps is reported, after untimed warm-up steps.  Every variant walks the same
batches (same rows, same seed).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \\
        .venv/bin/python scripts/bench_teacher_steps.py --parts layers,cache,student \\
        --out /tmp/teacher-steps.md
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from harness.api.capture import capture_attention_scores
from harness.api.method import TeacherView, stage_layers
from harness.api.registry import instantiate
from harness.common.cache import ArtifactCache
from harness.data.features import BucketBatchSampler, PaddingCollator
from harness.data.metrics import TaskEvaluator
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.teacher.outputs import (
    IntermediateCacheRequest,
    TeacherRuntime,
    estimate_bytes,
    live_teacher_outputs,
    prepare_intermediates,
)
from harness.training.engine import train_stage


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runner = SuiteRunner(load_suite(args.suite), Path(tempfile.mkdtemp()),
                                  log=lambda message: print(message, flush=True))
        self.prepared = self.runner.planner.prepare_task(args.task)
        self.task = self.prepared.task
        self.teacher = self.runner.teacher(args.task)
        train = self.prepared.splits["train"]
        self.rows = min(args.rows, len(train))
        self.split = train.subset(range(self.rows), name=f"train[:{self.rows}]")
        self.cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="teacher-steps-"))
        self.lines: list[str] = []

    def steps(self, method_name: str, stage_name: str, overrides: dict | None = None,
              live_layers: bool = True, cached: bool = False, precision: str = "no",
              compile_student: bool = False, logits: bool = False) -> dict[str, float]:
        """Median ms per step of one stage of ``method_name`` on the bench rows."""
        from harness.experiments.planner import Variation

        runner, args = self.runner, self.args
        if method_name == "tinybert":  # timing does not depend on the starting weights
            overrides = {"params.general_distillation": False, **(overrides or {})}
        variation = Variation.of(overrides=overrides)
        plan = runner.planner.resolve(method_name, args.task, 1, variation)
        method, spec, configs = plan.method, plan.spec, plan.stage_configs
        stage = next(s for s in method.stages(self.task) if s.name == stage_name)
        context = runner._student_context(spec["student"]["name"], self.task)
        torch.manual_seed(0)
        student, extra = runner._build_student(method, context)
        runtime = TeacherRuntime()
        if logits:
            runtime.train_logits = np.asarray(self.teacher.logits("train"))[:self.rows]
        if set(stage.teacher_outputs) - {"logits"}:
            runtime.model = self.teacher.load_model()
        if cached:
            runtime.intermediate_cache = IntermediateCacheRequest(
                cache=ArtifactCache(self.cache_dir), teacher_key=self.teacher.key,
                max_gb=args.max_gb, batch_size=runner.suite.teacher.inference_batch_size,
                log=lambda message: print(message, flush=True))
        if not live_layers:
            method.teacher_layers = lambda *_: None  # the whole teacher, as before
        config = configs[stage_name].model_copy(update={
            "max_steps": args.warmup + args.steps, "epoch_size": "data",
            "log_every_steps": 10_000, "mixed_precision": precision,
            "compile": compile_student, "eval_every_steps": None})
        stamps: list[float] = []
        compute = method.compute_losses

        def timed(inputs):
            stamps.append(time.perf_counter())
            return compute(inputs)

        method.compute_losses = timed
        torch.manual_seed(0)
        started = time.perf_counter()
        train_stage(method=method, stage=stage, student=student, extra=extra, config=config,
                    train_split=self.split, eval_split=None,
                    evaluator=TaskEvaluator(self.task), teacher=runtime,
                    accelerator=runner.accelerator, seed=1, task_train_size=self.rows)
        total = time.perf_counter() - started
        intervals = np.diff(stamps)[args.warmup - 1:]
        return {"intervals": list(intervals), "first_two_s": stamps[1] - started,
                "total_s": total, "layers": (stage_layers(
                    method, stage, runtime.model.config.num_hidden_layers, student)
                    if runtime.model is not None else None)}

    def compare(self, variants: list[tuple[str, dict]]) -> list[dict]:
        """Each variant ``--rounds`` times, round-robin (load drifts alike over all), the
        timed steps of its rounds pooled."""
        results: list[dict] = [{"intervals": [], "first_two_s": []} for _ in variants]
        for _ in range(self.args.rounds):
            for result, (label, kwargs) in zip(results, variants, strict=True):
                run = self.steps(**kwargs)
                print(f"  {label}: {1000 * np.median(run['intervals']):.0f} ms", flush=True)
                result["intervals"] += run["intervals"]
                result["first_two_s"].append(run["first_two_s"])
                result["layers"] = run["layers"]
        for result in results:
            intervals = np.asarray(result["intervals"])
            median = float(np.median(intervals))
            result.update({"ms": 1000 * median,
                           "q1": 1000 * float(np.percentile(intervals, 25)),
                           "q3": 1000 * float(np.percentile(intervals, 75)),
                           "overhead_s": float(np.mean(result["first_two_s"])) - 2 * median})
        return results

    def row(self, label: str, result: dict[str, float], reference: float | None = None,
            extra: str = "") -> None:
        speed = f"{reference / result['ms']:.2f}x" if reference else "1.00x"
        line = (f"| {label} | {result['ms']:.0f} ({result['q1']:.0f}-{result['q3']:.0f}) | "
                f"{speed} | {extra} |")
        print(line, flush=True)
        self.lines.append(line)

    def header(self, title: str) -> None:
        self.lines += ["", f"**{title}**", "",
                       "| variant | ms per step, median (IQR) | speed-up | note |",
                       "|---|---|---|---|"]

    # -- parts --------------------------------------------------------------------------
    def forward(self) -> None:
        """The teacher outputs of a step alone, paired per batch: every variant on the same
        batch back to back (order rotating), so load from other jobs hits them alike."""
        args = self.args
        self.lines += ["", f"**Teacher outputs of one step, paired per batch ({args.task}, "
                       f"{args.batches} real batches of 32 x {args.rounds * 2} repeats; ms per "
                       "batch, medians)**", "",
                       "| stage (layers read) | whole teacher (before) | stopped after the "
                       "deepest layer read (after) | saved per step | fp16 disk cache | "
                       "cache vs stopped |", "|---|---|---|---|---|---|"]
        collate = PaddingCollator(self.split)
        sampler = BucketBatchSampler(self.split.lengths, 32, shuffle=True, seed=1)
        batches = [collate(rows) for rows in list(sampler)[:args.batches]]
        for label, method_name, stage_name, overrides, disabled, cache in (
                ("TinyBERT intermediate, mapping [2,3,5,6]", "tinybert", "intermediate",
                 {}, None, True),
                ("TinyBERT intermediate, bottom [1,2,3,4]", "tinybert", "intermediate",
                 {"params.mapping": "bottom"}, None, False),
                ("TinyBERT-no-attn intermediate, [2,3,5,6]", "tinybert", "intermediate",
                 {}, ["attention"], False),
                ("BERT-PKD task stage (3L-384, layers 2,4)", "bert-pkd", "task", {}, None,
                 False)):
            line = self._paired(label, method_name, stage_name, overrides, disabled, cache,
                                batches)
            print(line, flush=True)
            self.lines.append(line)
        if hasattr(self, "build_seconds"):
            line = (f"\nBuilding the cache entries for {self.rows} rows took "
                    f"{self.build_seconds:.1f}s ({self.rows / self.build_seconds:.0f} rows/s: "
                    "teacher forward to layer 6 at batch 128 plus the fp16 writes).")
            print(line, flush=True)
            self.lines.append(line)

    def _paired(self, label, method_name, stage_name, overrides, disabled, cache, batches):
        from harness.experiments.planner import Variation

        runner, args = self.runner, self.args
        if method_name == "tinybert":
            overrides = {"params.general_distillation": False, **overrides}
        recipe = runner.planner.recipe(method_name, args.task, Variation.of(overrides=overrides))
        if disabled:
            recipe = recipe.model_copy(update={"disabled_losses": disabled})
        method = instantiate(runner.suite.plugin(method_name), recipe, args.task)
        stage = next(s for s in method.stages(self.task) if s.name == stage_name)
        context = runner._student_context(recipe.student or runner.suite.default_student,
                                          self.task)
        student, _ = runner._build_student(method, context)
        whole_model = self.teacher.load_model().eval()
        stopped_model = self.teacher.load_model().eval()
        layers = stage_layers(method, stage, whole_model.config.num_hidden_layers, student)
        scores = "attention_scores" in stage.teacher_outputs
        cached = None
        if cache:
            request = IntermediateCacheRequest(
                cache=ArtifactCache(self.cache_dir), teacher_key=self.teacher.key,
                max_gb=args.max_gb, batch_size=runner.suite.teacher.inference_batch_size,
                log=lambda message: print(message, flush=True))
            started = time.perf_counter()
            cached = prepare_intermediates(request, stopped_model, self.split, layers,
                                           runner.accelerator)
            self.build_seconds = time.perf_counter() - started
        times: dict[str, list[list[float]]] = {}
        with ExitStack() as stack:
            whole_capture = (stack.enter_context(capture_attention_scores(whole_model))
                             if scores else None)
            stopped_capture = (stack.enter_context(capture_attention_scores(
                stopped_model, sorted(layers.scores))) if scores else None)
            stack.enter_context(torch.inference_mode())
            variants = [
                ("whole", lambda batch: live_teacher_outputs(
                    whole_model, batch, stage, TeacherView(), None, whole_capture, False)),
                ("stopped", lambda batch: live_teacher_outputs(
                    stopped_model, batch, stage, TeacherView(), layers, stopped_capture,
                    False))]
            if cached is not None:
                variants.append(("cached", lambda batch: cached.fill(
                    TeacherView(), batch, stage.teacher_outputs)))
            for batch in batches[:2]:  # warm-up
                for _, run in variants:
                    run(batch)
            for repeat in range(args.rounds * 2):
                row: dict[str, list[float]] = {name: [] for name, _ in variants}
                for index, batch in enumerate(batches):
                    shift = (index + repeat) % len(variants)
                    for name, run in variants[shift:] + variants[:shift]:
                        started = time.perf_counter()
                        run(batch)
                        row[name].append(time.perf_counter() - started)
                for name, values in row.items():
                    times.setdefault(name, []).append(values)
        arrays = {name: 1000 * np.asarray(values) for name, values in times.items()}
        whole, stopped = arrays["whole"], arrays["stopped"]
        cells = [f"{np.median(whole):.0f}",
                 f"{np.median(stopped):.0f} ({np.median(whole / stopped):.2f}x)",
                 f"{np.median(whole - stopped):.0f} ms"]
        if "cached" in arrays:
            cells += [f"{np.median(arrays['cached']):.1f}",
                      f"{np.median(stopped / arrays['cached']):.0f}x faster"]
        else:
            cells += ["-", "-"]
        return (f"| {label} (depth {layers.depth}, hidden {sorted(layers.hidden)}, scores "
                f"{sorted(layers.scores)}) | " + " | ".join(cells) + " |")

    def layers(self) -> None:
        self.header(f"Live teacher forward: whole vs stopped after the deepest layer read "
                    f"({self.args.task}, batch 32)")
        for label, method, stage, overrides, logits in (
                ("TinyBERT intermediate, mapping [2,3,5,6]", "tinybert", "intermediate",
                 None, False),
                ("TinyBERT intermediate, bottom [1,2,3,4]", "tinybert", "intermediate",
                 {"params.mapping": "bottom"}, False),
                ("BERT-PKD task stage (3L-384, layers 2,4)", "bert-pkd", "task", None, True)):
            common = {"method_name": method, "stage_name": stage, "overrides": overrides,
                      "logits": logits}
            whole, stopped = self.compare([("whole", {**common, "live_layers": False}),
                                           ("stopped", common)])
            self.row(f"{label}: whole teacher (before)", whole)
            layers = stopped["layers"]
            self.row(f"{label}: stopped (after)", stopped, whole["ms"],
                     f"depth {layers.depth}, hidden {sorted(layers.hidden)}, scores "
                     f"{sorted(layers.scores)}; saves {whole['ms'] - stopped['ms']:.0f} ms")

    def cache(self) -> None:
        self.header(f"TinyBERT intermediate stage: live teacher vs fp16 disk cache "
                    f"({self.args.task}, batch 32)")
        common = {"method_name": "tinybert", "stage_name": "intermediate"}
        folder = self.cache_dir / "teacher_intermediates"
        before = len(list(folder.iterdir())) if folder.exists() else 0
        started = time.perf_counter()
        first = self.steps(**common, cached=True)  # builds the entries if missing
        built = time.perf_counter() - started - first["total_s"]
        note = (f"entries for {self.rows} rows built in {built:.0f}s "
                f"({self.rows / built:.0f} rows/s)"
                if len(list(folder.iterdir())) > before else "entries already cached")
        live, cached = self.compare([("live", common), ("cached", {**common, "cached": True})])
        self.row("live teacher (stopped forward)", live)
        self.row("disk cache (entries reused)", cached, live["ms"], note)
        layers = cached["layers"]
        config = self.teacher.config()
        lines = ["", "Entry sizes (fp16, unpadded rows, from the token counts; hidden states "
                 f"of {sorted(layers.hidden)}, scores of {sorted(layers.scores)}):", ""]
        suite = self.runner.suite
        copies = suite.recipe("tinybert").params_for(None).get("augmentation", {}).get(
            "copies", 0)
        for name in suite.tasks:
            split = self.runner.planner.prepare_task(name).splits["train"]
            task_copies = suite.recipe("tinybert").params_for(name).get(
                "augmentation", {}).get("copies", copies)
            size = estimate_bytes(split.lengths, layers, config.hidden_size,
                                  config.num_attention_heads)
            lines.append(f"- {name}: train {len(split)} rows, mean length "
                         f"{np.mean(split.lengths):.1f}: {size['total'] / 1e9:.2f} GB; with "
                         f"{task_copies} augmented copies per row about "
                         f"{size['total'] * (1 + task_copies) / 1e9:.2f} GB")
        print("\n".join(lines), flush=True)
        self.lines += lines

    def student(self) -> None:
        self.header(f"Student: fp32 vs bf16 autocast vs torch.compile ({self.args.task}, "
                    "batch 32; overhead = first two steps minus two median steps)")
        for label, method, stage, kwargs in (
                ("kd 4L-192", "kd", "task", {"logits": True}),
                ("TinyBERT intermediate 4L-192 (cached teacher)", "tinybert", "intermediate",
                 {"cached": True})):
            common = {"method_name": method, "stage_name": stage, **kwargs}
            base, bf16, compiled = self.compare([
                ("fp32", common), ("bf16", {**common, "precision": "bf16"}),
                ("compile", {**common, "compile_student": True})])
            self.row(f"{label}: fp32", base)
            self.row(f"{label}: bf16 autocast", bf16, base["ms"])
            self.row(f"{label}: torch.compile", compiled, base["ms"],
                     f"compile overhead ~{compiled['overhead_s']:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="glue-cpu")
    parser.add_argument("--task", default="mrpc")
    parser.add_argument("--rows", type=int, default=640, help="first N training rows")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per variant, "
                        "round-robin over the variants compared")
    parser.add_argument("--parts", default="forward,layers,cache,student")
    parser.add_argument("--batches", type=int, default=12,
                        help="real batches of the paired teacher-output timing")
    parser.add_argument("--cache-dir", default=None, help="where the bench's disk cache "
                        "entries go (default: a fresh temporary folder)")
    parser.add_argument("--max-gb", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    bench = Bench(args)
    for part in args.parts.split(","):
        getattr(bench, part.strip())()
    load = os.getloadavg()
    header = (f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.node()} "
              f"({os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)), "
              f"{args.task} first {bench.rows} training rows, {args.rounds} runs per variant "
              f"(round-robin) of {args.warmup} warm-up + {args.steps} timed steps; load "
              f"average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    text = "\n".join([header, *bench.lines]) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

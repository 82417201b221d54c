"""Teacher logits in fp32 and bf16: time, differences and dev score (``python -m
benchmarks teacher-precision``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.teacher.outputs import autocast_setting


def run_precision_benchmark(*, suite: str = "glue-cpu", tasks: Iterable[str] = ("mrpc", "sst2"),
                            train_rows: int = 1000, batch_size: int | None = None,
                            precisions: Iterable[str] = ("fp32", "bf16"),
                            data_dir: str | None = None, cache_dir: Path | None = None,
                            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Teacher logits in each precision on each task's dev split(s) and its first
    ``train_rows`` training rows, with the suite's cached fine-tuned teacher: wall time,
    differences to fp32 (max and mean |logit diff|, argmax agreement) and the dev main
    metric.  Returns the rows and a Markdown table."""
    import os
    import platform
    import tempfile
    from datetime import datetime, timezone

    from harness.common.cli_options import recipe_overrides
    from harness.data.metrics import TaskEvaluator
    from harness.experiments.runner import SuiteRunner
    from harness.experiments.suites import load_suite
    from harness.training.engine import predict_logits

    config = load_suite(suite, recipe_overrides(None, data_dir, None))
    precisions = list(precisions)
    if precisions[0] != "fp32":
        precisions = ["fp32", *[p for p in precisions if p != "fp32"]]
    runner = SuiteRunner(config, Path(tempfile.mkdtemp(prefix="precision-")), cache_dir, log=log)
    accelerator = runner.accelerator
    batch = batch_size or config.teacher.inference_batch_size
    rows: list[dict[str, Any]] = []
    for name in tasks:
        prepared = runner.planner.prepare_task(name)
        task = prepared.task
        model = runner.teacher(name).load_model().to(accelerator.device).eval()
        evaluator = TaskEvaluator(task)
        parts = {split: prepared.splits[split] for split in task.dev_splits}
        if train_rows:
            train = prepared.splits["train"]
            count = min(train_rows, len(train))
            parts[f"train[:{count}]"] = train.subset(range(count))
        warmup = next(iter(parts.values())).subset(range(min(8, batch)))
        for split_name, split in parts.items():
            reference = None
            for precision in precisions:
                setting = autocast_setting(precision)
                predict_logits(model, warmup, accelerator, batch, setting, distributed=False)
                started = time.perf_counter()
                logits = predict_logits(model, split, accelerator, batch, setting,
                                        distributed=False)
                seconds = time.perf_counter() - started
                row: dict[str, Any] = {
                    "task": name, "split": split_name, "rows": len(split),
                    "tokens": int(np.asarray(split.lengths).sum()), "precision": precision,
                    "seconds": seconds, "rows_per_second": len(split) / seconds}
                if reference is None:
                    reference = logits
                difference = np.abs(logits - reference)
                row["max_abs_diff"] = float(difference.max())
                row["mean_abs_diff"] = float(difference.mean())
                row["argmax_agreement"] = (None if task.is_regression else float(
                    100 * np.mean(logits.argmax(-1) == reference.argmax(-1))))
                if split_name in task.dev_splits:
                    row["metric"] = task.main_metric
                    row["score"] = evaluator.score(logits, split.labels)[task.main_metric]
                rows.append(row)
                log(f"[precision] {name} {split_name} {precision}: {seconds:.1f}s, max |diff| "
                    f"{row['max_abs_diff']:.2e}, score {row.get('score', '-')}")
        del model
    load = os.getloadavg()
    header = (f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on "
              f"{platform.node()} ({platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), "
              f"device {accelerator.device}), batch {batch}, load average "
              f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    table = [header, "",
             "| task | rows | precision | seconds | rows/s | vs fp32 | max abs diff | "
             "mean abs diff | argmax agree % | dev main metric |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fp32_seconds = {(row["task"], row["split"]): row["seconds"] for row in rows
                    if row["precision"] == "fp32"}
    for row in rows:
        ratio = row["seconds"] / fp32_seconds[row["task"], row["split"]]
        agreement = ("-" if row["argmax_agreement"] is None
                     else f"{row['argmax_agreement']:.2f}")
        score = f"{row['metric']} {row['score']:.2f}" if "score" in row else "-"
        table.append(f"| {row['task']} {row['split']} | {row['rows']} | {row['precision']} | "
                     f"{row['seconds']:.1f} | {row['rows_per_second']:.1f} | {ratio:.2f}x | "
                     f"{row['max_abs_diff']:.2e} | {row['mean_abs_diff']:.2e} | {agreement} | "
                     f"{score} |")
    return {"rows": rows, "table": table, "header": header}

"""The run-level benches on tiny models: memory across runs in one process (and the peak
memory every record carries), the cache payoff table, per-method costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.memory import (
    cache_table,
    fit_slope,
    flatness_slopes,
    method_costs,
    plot_memory_flatness,
    read_rows,
    run_memory_flatness,
)
from harness.common.cache import content_hash
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from tests.records import run_record


@pytest.mark.slow
def test_slopes_and_the_figure(tmp_path):
    assert fit_slope([0, 1, 2, 3], [10, 12, 14, 16]) == pytest.approx(2.0)
    assert fit_slope([1], [3]) is None
    rows = [{"run": i, "round": i // 4, "seed": 1 + i // 4, "task": "rte",
             "method": ["kd", "finetune"][i % 2], "peak_rss_mb": 900.0 + 5 * (i % 3),
             "rss_after_gc_mb": 700.0 + (3.0 * i if i >= 4 else 0)} for i in range(12)]
    slope, peak_slope = flatness_slopes(rows)
    assert slope == pytest.approx(3.0) and abs(peak_slope) < 1
    files = plot_memory_flatness([("before", rows), ("after", rows)], tmp_path / "flat")
    assert [f.suffix for f in files] == [".png", ".svg"] and all(f.stat().st_size for f in files)
    assert "resident memory" in files[1].read_text()


@pytest.mark.e2e
def test_records_carry_peak_memory_and_many_runs_in_one_process_stay_flat(
        tiny_suite_file, tmp_path):
    """The bench's loop on the tiny suite: every record has its memory, which is no part
    of the run id; the CSV reads back; RSS after the later runs does not climb."""
    result = run_memory_flatness(
        suite=str(tiny_suite_file), methods=["kd"], tasks=["rte"], seeds=[1, 2, 3],
        max_steps=2, results_dir=tmp_path / "results", cache_dir=tmp_path / "cache",
        csv_path=tmp_path / "flat.csv", log=lambda _: None)
    assert [row["status"] for row in result.rows] == ["finished"] * 3
    rows = read_rows(tmp_path / "flat.csv")
    assert [row["run"] for row in rows] == list(range(3)) and rows[0]["heap_trim"] == "True"
    assert all(row["peak_rss_mb"] >= row["rss_after_gc_mb"] - 64 for row in rows)
    # Tiny models: a leak of whole models or optimisers per run would still show here.
    assert result.slope_mb_per_run is not None and result.slope_mb_per_run < 25
    runner = SuiteRunner(load_suite(str(tiny_suite_file), ["training.max_steps=2"]),
                         tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    for path in (tmp_path / "results").glob("**/*.json"):
        record = json.loads(path.read_text())
        assert record["memory"]["peak_rss_mb"] >= record["memory"]["rss_start_mb"] > 0
        spec = runner.planner.resolve(record["method"], record["task"], record["seed"]).spec
        assert content_hash(spec) == record["config_hash"]  # memory is not configuration
        assert "memory" not in record["config"]


def test_method_costs_sum_a_seed_over_the_tasks_and_take_peaks_where_measured(
        tiny_suite_file, tmp_path):
    def write(root: Path, method: str, task: str, seed: int, seconds: float, **extra) -> None:
        path = root / "tiny" / method / task / f"s{seed}-{len(extra)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        record = run_record(method=method, task=task, seed=seed, wall_seconds=seconds,
                            **extra)
        path.write_text(json.dumps(record.document()))

    results, measured = tmp_path / "results", tmp_path / "measured"
    for seed in (1, 2):
        write(results, "kd", "rte", seed, 60.0 * seed)
        write(results, "kd", "stsb", seed, 120.0)
    write(results, "kd", "rte", 3, 60.0)  # seed 3 lacks stsb: not a full seed
    write(results, "kd", "stsb", 1, 999.0, variation={"task_epochs": 3})  # a grid budget
    write(results, "finetune", "rte", 1, 30.0)
    write(measured, "kd", "rte", 1, 61.0, memory={"peak_rss_mb": 812.0})
    write(measured, "kd", "stsb", 1, 600.0, memory={"peak_rss_mb": 700.0})  # lower, longer
    rows, lines = method_costs(results, str(tiny_suite_file), [measured])
    kd = next(row for row in rows if row["method"] == "kd")
    assert kd["complete_seeds"] == 2 and kd["seed_minutes_mean"] == pytest.approx(3.5)
    # the peak's own run: its task and minutes, not another run's
    assert kd["peak_rss_mb"] == 812.0 and kd["peak_tasks"] == ["rte"]
    assert kd["peak_run_minutes"] == pytest.approx(61.0 / 60)
    assert "finetune" not in [row["method"] for row in rows]  # neither a full seed nor a peak
    rows, lines = method_costs(results, str(tiny_suite_file), [measured], ["finetune", "kd"])
    assert rows[0]["complete_seeds"] == 0 and rows[0]["peak_rss_mb"] is None
    assert "not measured" in lines[2] and lines[2].startswith("finetune")


def test_cache_table_prints_every_ratio_with_its_verdict():
    rows = [{"step": "first", "seconds": 100.0, "ratio": None, "pass": None,
             "record_wall_seconds": 30.0, "train_seconds": 20.0, "steps": 10,
             "examples_seen": 320, "train_examples": 320, "peak_rss_mb": 900.0},
            {"step": "second", "seconds": 40.0, "ratio": 0.4, "pass": True,
             "record_wall_seconds": 30.0, "train_seconds": 20.0, "steps": 10,
             "examples_seen": 320, "train_examples": 320, "peak_rss_mb": 700.0},
            {"step": "trial", "seconds": 60.0, "ratio": 0.6, "pass": False,
             "record_wall_seconds": None, "train_seconds": None, "steps": 0,
             "examples_seen": 0, "train_examples": None, "peak_rss_mb": None}]
    result = {"task": "sst2", "train_examples": 320, "work_dir": "/tmp/x", "date": "today",
              "load_average_before": (1.0, 1.0, 1.0), "load_average_after": None,
              "rows": rows, "target": 0.5,
              "teacher": {"finetune_steps": 5, "finetune_examples": 160},
              "first_breakdown": {"total": 100.0, "teacher_finetune": 50.0,
                                  "teacher_logits_and_save": 10.0, "student_training": 20.0,
                                  "student_eval_and_inference_timing": 10.0,
                                  "process_data_and_rest": 10.0}}
    text = "\n".join(cache_table(result))
    assert "0.40x" in text and "PASS" in text and "0.60x" in text and "MISS" in text
    assert "teacher fine-tuning 50.0s" in text
    # A teacher labels its training and dev splits, not the test split.
    assert "teacher logits on the training and dev splits and save 10.0s" in text

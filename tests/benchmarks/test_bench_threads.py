
"""`python -m benchmarks threads` on a tiny suite: the same cell alone on two threads, then twice at
once on one thread each, as whole `harness run` processes."""

from __future__ import annotations

import pytest

from benchmarks.threads import run_threads_benchmark


@pytest.mark.slow
def test_threads_benchmark_times_both_modes_on_a_real_cell(tiny_suite_file, tmp_path):
    messages: list[str] = []
    result = run_threads_benchmark(suite=str(tiny_suite_file), method="kd", task="rte",
                                   sets=[], cores=2, cache_dir=tmp_path / "cache",
                                   log=messages.append)
    assert result.cores == 2 and len(result.parallel_seconds) == 2
    assert result.alone_seconds > 0 and min(result.parallel_seconds) > 0
    assert result.parallel_wall >= max(result.parallel_seconds)
    assert result.parallel_per_hour == 3600 * 2 / result.parallel_wall
    table = result.table("harness run ...")
    assert len(table) == 4 and "cells/h" in table[1] and "throughput ratio" in table[3]
    assert messages[0].startswith("warming")
    # the timed runs wrote to their own stores, not to the repository's results/
    assert (tmp_path / "cache" / "teachers").is_dir()


@pytest.mark.e2e
def test_each_parallel_job_is_timed_when_it_ends(monkeypatch):
    """Jobs that end in another order than they started keep their own times (the jobs
    are processes sleeping 1.5 s and 0.1 s: what is checked is which job the time of each
    is, not a speed)."""
    import subprocess
    import sys

    import benchmarks.threads as threads

    sleeps = iter([0.0, 0.0, 1.5, 0.1])  # warm-up, alone, then job 0 (slow), job 1 (fast)

    def sleeping(arguments, threads_count, results):
        return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({next(sleeps)})"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    monkeypatch.setattr(threads, "_run", sleeping)
    result = threads.run_threads_benchmark(suite="s", method="m", task="t", sets=[], cores=2,
                                           log=lambda _: None)
    slow, fast = result.parallel_seconds
    assert slow >= 1.5 and fast < slow - 1.0
    assert result.parallel_wall >= slow

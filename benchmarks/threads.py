"""Both cores for one job, or one core each for two jobs?  Measured on a real cell.

The same `harness run` cell is timed as whole processes: first alone with every core's
thread (``OMP_NUM_THREADS`` = cores), then as that many copies at once with one thread each
(different seeds, so none skips another's record).  Each process writes to a store of its
own; the teacher and other one-offs come from the shared cache, warmed by an untimed first
run.  The figure that decides how to run a grid is throughput: cells per hour in each mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ThreadsResult:
    cores: int
    alone_seconds: float
    parallel_seconds: list[float]
    parallel_wall: float

    @property
    def alone_per_hour(self) -> float:
        return 3600.0 / self.alone_seconds

    @property
    def parallel_per_hour(self) -> float:
        return 3600.0 * len(self.parallel_seconds) / self.parallel_wall

    def table(self, command: str) -> list[str]:
        faster = "two single-threaded jobs" if self.parallel_per_hour > self.alone_per_hour \
            else "one job on every core"
        return [
            f"cell: {command}",
            f"one job, {self.cores} threads: {self.alone_seconds:.1f} s "
            f"({self.alone_per_hour:.1f} cells/h)",
            f"{self.cores} jobs at once, 1 thread each: "
            + ", ".join(f"{seconds:.1f} s" for seconds in self.parallel_seconds)
            + f" (wall {self.parallel_wall:.1f} s; {self.parallel_per_hour:.1f} cells/h)",
            f"one job alone is {self.parallel_seconds[0] / self.alone_seconds:.2f}x faster than "
            f"one of {self.cores} sharing the cores; throughput ratio "
            f"{self.parallel_per_hour / self.alone_per_hour:.2f}x: {faster} finish more cells",
        ]


def _run(arguments: list[str], threads: int, results: Path) -> subprocess.Popen:
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads),
                   "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "run", *arguments,
                             "--results", str(results)], env=environment,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait(process: subprocess.Popen, started: float) -> float:
    _, errors = process.communicate()
    if process.returncode:
        raise RuntimeError(f"the timed run failed (exit {process.returncode}):\n{errors[-2000:]}")
    return time.perf_counter() - started


def run_threads_benchmark(*, suite: str, method: str, task: str, sets: list[str],
                          cores: int | None = None, cache_dir: Path | None = None,
                          log=print) -> ThreadsResult:
    cores = cores or os.cpu_count() or 1
    common = ["--suite", suite, "--method", method, "--tasks", task]
    if cache_dir is not None:
        common += ["--cache-dir", str(cache_dir)]
    for assignment in sets:
        common += ["--set", assignment]
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as scratch:
        root = Path(scratch)
        log("warming the caches (teacher, one-offs): an untimed run")
        _wait(_run([*common, "--seeds", "100"], cores, root / "warm"), time.perf_counter())
        log(f"one job, {cores} threads")
        started = time.perf_counter()
        alone = _wait(_run([*common, "--seeds", "101"], cores, root / "alone"), started)
        log(f"{cores} jobs at once, 1 thread each")
        started = time.perf_counter()
        processes = [_run([*common, "--seeds", str(102 + index)], 1, root / f"job{index}")
                     for index in range(cores)]
        # Each job's time is taken as it ends: waited on one after another, a job that ends
        # first would be charged the time of those before it.
        with ThreadPoolExecutor(len(processes)) as pool:
            parallel = list(pool.map(lambda process: _wait(process, started), processes))
        wall = time.perf_counter() - started
    return ThreadsResult(cores, alone, parallel, wall)


def describe(result: ThreadsResult) -> dict[str, Any]:
    return {"cores": result.cores, "alone_seconds": result.alone_seconds,
            "parallel_seconds": result.parallel_seconds, "parallel_wall": result.parallel_wall,
            "alone_cells_per_hour": result.alone_per_hour,
            "parallel_cells_per_hour": result.parallel_per_hour}

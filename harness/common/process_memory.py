"""Peak memory of one run: resident set size (and CUDA allocations on a GPU).

On Linux the kernel keeps a process's peak resident set size (``VmHWM`` in
``/proc/self/status``); writing ``5`` to ``/proc/self/clear_refs`` resets it to the
current size, so a run that resets it when it starts and reads it when it ends gets its
own peak even in a process that ran other runs before (a grid, a tuning study).  Where
that file is not writable (not Linux, some containers), the peak falls back to
``resource.getrusage``'s ``ru_maxrss``: the peak of the whole process so far, marked
``scope: process`` in the record.

A record's ``memory`` is a result, never part of its configuration: it does not enter
the run id.

Between runs, :func:`release_freed_memory` collects cyclic garbage and hands the heap's
free pages back to the system (glibc ``malloc_trim``).  Without it a process that runs
many cells (a grid, a tuning study) keeps the high-water mark of every earlier run as
freed-but-resident heap, so its resident memory grows from round to round although the
live tensors stay the same (the measurement is in notes/2026-11-27-benchmarks-log.md).
``HARNESS_RELEASE_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import resource
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

RELEASE = os.environ.get("HARNESS_RELEASE_MEMORY", "1") != "0"
"""Whether :func:`release_freed_memory` trims the heap (the runner calls it after each run)."""
STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
MB = 1024 * 1024


def _status_kb(field: str, status: Path = STATUS) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or None."""
    try:
        text = status.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return None


def rss_mb() -> float | None:
    """The current resident set size in MiB (None where /proc is missing)."""
    kb = _status_kb("VmRSS")
    return kb / 1024 if kb is not None else None


def reset_peak_rss(clear_refs: Path | None = None) -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS; False if not possible."""
    try:
        (clear_refs or CLEAR_REFS).write_text("5")
    except OSError:
        return False
    return True


def lifetime_peak_rss_mb() -> float:
    """The process's peak RSS since it started, from getrusage (kB on Linux, bytes on
    macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak / 1024


class MemoryProbe:
    """Started when a run starts, read when it ends: ``{peak_rss_mb, rss_start_mb,
    rss_end_mb, scope, source}`` plus ``cuda_*`` peaks when ``device`` is a GPU."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.scope = "run"
        self.rss_start: float | None = None

    def start(self) -> MemoryProbe:
        self.scope = "run" if reset_peak_rss() and _status_kb("VmHWM") is not None else "process"
        self.rss_start = rss_mb()
        if self.device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def read(self) -> dict[str, Any]:
        hwm = _status_kb("VmHWM") if self.scope == "run" else None
        peak = hwm / 1024 if hwm is not None else lifetime_peak_rss_mb()
        result: dict[str, Any] = {
            "peak_rss_mb": round(peak, 1),
            "rss_start_mb": _round(self.rss_start),
            "rss_end_mb": _round(rss_mb()),
            # run: the peak since this run started (VmHWM reset through clear_refs);
            # process: getrusage's peak since the process started (a reset was impossible).
            "scope": self.scope if hwm is not None else "process",
            "source": "proc_status_vmhwm" if hwm is not None else "getrusage_maxrss",
        }
        if self.device.type == "cuda" and torch.cuda.is_available():
            result["cuda_max_allocated_mb"] = round(
                torch.cuda.max_memory_allocated(self.device) / MB, 1)
            result["cuda_max_reserved_mb"] = round(
                torch.cuda.max_memory_reserved(self.device) / MB, 1)
        return result


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.malloc_trim  # noqa: B018  (glibc only: musl has none)
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_memory() -> bool:
    """Collect cyclic garbage, then return the heap's free pages to the system (glibc's
    ``malloc_trim(0)``); True when the trim ran.  Off with ``HARNESS_RELEASE_MEMORY=0``."""
    gc.collect()
    if not RELEASE:
        return False
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True

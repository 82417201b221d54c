"""The memory probe of every run record and the heap release between runs."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import harness.common.process_memory as memory
from harness.common.process_memory import MemoryProbe, release_freed_memory, rss_mb

LINUX = sys.platform.startswith("linux")


@pytest.mark.skipif(not LINUX, reason="/proc/self/status is Linux's")
def test_the_probe_sees_an_allocation_made_after_its_start_and_resets_between_runs():
    probe = MemoryProbe("cpu").start()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    reading = probe.read()
    del block
    assert reading["scope"] == "run" and reading["source"] == "proc_status_vmhwm"
    assert reading["peak_rss_mb"] >= reading["rss_start_mb"] + 48
    assert set(reading) == {"peak_rss_mb", "rss_start_mb", "rss_end_mb", "scope", "source"}
    release_freed_memory()
    again = MemoryProbe("cpu").start().read()  # a new run: the old peak is gone
    assert again["peak_rss_mb"] < reading["peak_rss_mb"] - 32


def test_without_a_writable_clear_refs_the_peak_is_the_process_lifetime(monkeypatch,
                                                                       tmp_path):
    monkeypatch.setattr(memory, "CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    reading = MemoryProbe("cpu").start().read()
    assert reading["scope"] == "process" and reading["source"] == "getrusage_maxrss"
    assert reading["peak_rss_mb"] > 0


def test_release_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(memory, "RELEASE", False)
    assert release_freed_memory() is False
    monkeypatch.setattr(memory, "RELEASE", True)
    assert release_freed_memory() is (LINUX and memory._libc() is not None)


def test_rss_is_read():
    if LINUX:
        assert rss_mb() > 10

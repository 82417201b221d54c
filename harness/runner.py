"""Orchestration: data -> teacher -> method stages -> engine -> results store.

One :class:`SuiteRunner` per process and suite.  It prepares each task once (data,
tokenised splits, cached teacher) and runs (method, task, seed) cells, skipping any whose
resolved configuration already has a record.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from harness.cache import ArtifactCache, content_hash, default_cache_dir
from harness.config import ConfigError, SuiteConfig, TrainConfig
from harness.data import TaskData, load_task
from harness.engine import NonFiniteLossError, TeacherRuntime, predict_logits, train_stage
from harness.features import EncodedSplit, encode_split
from harness.method import Method, StudentContext, instantiate, registry
from harness.metrics import TaskEvaluator
from harness.store import RECORD_VERSION, ResultsStore
from harness.student import count_parameters
from harness.tasks import TaskSpec, get_task
from harness.teacher import (
    Checkpoint,
    TeacherArtifacts,
    check_label_order,
    load_base_config,
    load_pretrained_encoder,
    load_tokenizer,
    prepare_teacher,
    resolve_checkpoint,
    teacher_key,
)

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
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


@dataclass
class PreparedTask:
    task: TaskSpec
    data: TaskData
    splits: dict[str, EncodedSplit]
    max_length: int


@dataclass
class RunOutcome:
    method: str
    task: str
    seed: int
    status: str  # "finished", "skipped", "failed"
    path: Path | None
    main_score: float | None = None


class SuiteRunner:
    def __init__(self, suite: SuiteConfig, results_dir: Path, cache_dir: Path | None = None,
                 log: Callable[[str], None] = print, retry_failed: bool = False) -> None:
        self.suite = suite
        self.store = ResultsStore(results_dir)
        self.cache = ArtifactCache(cache_dir or default_cache_dir())
        self.log = log
        self.retry_failed = retry_failed
        self.accelerator = Accelerator()
        self.checkpoint: Checkpoint = resolve_checkpoint(suite.teacher.checkpoint)
        self._tokenizer = None
        self._tasks: dict[str, PreparedTask] = {}
        self._teachers: dict[str, TeacherArtifacts] = {}
        self._teacher_state: dict[str, torch.Tensor] | None = None

    # -- preparation ---------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.checkpoint)
        return self._tokenizer

    def prepare_task(self, name: str) -> PreparedTask:
        if name not in self._tasks:
            task = get_task(name)
            data_config = self.suite.data
            data = load_task(task, source=data_config.source, data_dir=data_config.dir,
                             max_train_examples=data_config.max_train_examples.get(task.name),
                             subsample_seed=data_config.subsample_seed)
            lengths = data_config.max_seq_length
            max_length = lengths.pair if task.is_pair else lengths.single
            splits = {split: encode_split(split, dataset, task, self.tokenizer, max_length)
                      for split, dataset in data.splits.items()}
            self._tasks[name] = PreparedTask(task, data, splits, max_length)
        return self._tasks[name]

    def teacher_key(self, prepared: PreparedTask) -> str:
        return teacher_key(self.checkpoint, prepared.task, prepared.data.fingerprint,
                           self.suite.teacher, self.suite.teacher_train_config(prepared.task.name),
                           prepared.max_length)

    def teacher(self, name: str) -> TeacherArtifacts:
        if name not in self._teachers:
            prepared = self.prepare_task(name)
            self._teachers[name] = prepare_teacher(
                task=prepared.task, splits=prepared.splits,
                data_fingerprint=prepared.data.fingerprint, checkpoint=self.checkpoint,
                teacher=self.suite.teacher,
                training=self.suite.teacher_train_config(name),
                max_length=prepared.max_length, cache=self.cache,
                accelerator=self.accelerator, log=self.log)
        return self._teachers[name]

    def teacher_state(self) -> dict[str, torch.Tensor]:
        """The pre-trained teacher's weights (student initialisation)."""
        if self._teacher_state is None:
            encoder = load_pretrained_encoder(self.checkpoint)
            self._teacher_state = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
        return self._teacher_state

    # -- one cell ------------------------------------------------------------------------
    def resolve(self, method_name: str, task_name: str, seed: int
                ) -> tuple[Method, dict[str, Any], dict[str, TrainConfig]]:
        """The method and the fully resolved configuration of one run (hashed for the id)."""
        task = get_task(task_name)
        recipe = self.suite.recipe(method_name)
        method = instantiate(method_name, recipe)
        stages = method.stages(task)
        stage_names = {stage.name for stage in stages}
        for stage_name in recipe.stages:
            if stage_name not in stage_names:
                raise ConfigError(f"methods.{method_name}.stages.{stage_name}: {method_name} "
                                  f"has no such stage; its stages are {sorted(stage_names)}")
        stage_configs = {stage.name: self.suite.train_config(task.name,
                                                             recipe.stages.get(stage.name))
                         for stage in stages}
        prepared = self.prepare_task(task_name)
        shape_name, shape = self.suite.student_for(method_name)
        spec = {
            "record_version": RECORD_VERSION,
            "suite": self.suite.name,
            "task": task.name,
            "method": method_name,
            "seed": seed,
            "student": {"name": shape_name, **shape.model_dump()},
            "params": method.params.model_dump(),
            "loss_weights": method.weights,
            "stages": {name: config.model_dump() for name, config in stage_configs.items()},
            "teacher": {"checkpoint": self.checkpoint.spec, "key": self.teacher_key(prepared)},
            "data": {  # content, not location: the same data hashes alike anywhere
                "source": self.suite.data.source,
                "fingerprint": prepared.data.fingerprint,
                "max_train_examples": self.suite.data.max_train_examples.get(task.name),
                "subsample_seed": self.suite.data.subsample_seed,
                "max_seq_length": prepared.max_length,
            },
        }
        return method, spec, stage_configs

    def run_one(self, method_name: str, task_name: str, seed: int) -> RunOutcome:
        method, spec, stage_configs = self.resolve(method_name, task_name, seed)
        run_hash = content_hash(spec)
        existing = self.store.find(run_hash)
        if existing is not None:
            record = self.store.load(existing)
            if record.get("status") == "finished" or not self.retry_failed:
                self.log(f"[skip] {method_name} {task_name} seed {seed}: already recorded "
                         f"({record.get('status')}) at {existing}")
                return RunOutcome(method_name, task_name, seed, "skipped", existing,
                                  record.get("main_score"))
        task = get_task(task_name)
        prepared = self.prepare_task(task_name)
        teacher = self.teacher(task_name)
        path = self.store.record_path(
            self.suite.name, method_name, task.name,
            f"{spec['student']['name']}-seed{seed}-{run_hash[:16]}")
        record: dict[str, Any] = {
            "run_id": run_hash,
            "status": "running",
            "suite": self.suite.name,
            "method": method_name,
            "task": task.name,
            "task_display": task.display_name,
            "seed": seed,
            "student_shape": spec["student"]["name"],
            "main_metric": task.main_metric,
            "teacher": {"checkpoint": self.checkpoint.spec, "key": teacher.key,
                        "dev": teacher.dev_metrics, "baseline": teacher.summary["baseline"],
                        "parameters": teacher.summary["parameters"]},
            "data": {"source": prepared.data.source, "fingerprint": prepared.data.fingerprint,
                     "files": prepared.data.files,
                     "train_examples": len(prepared.splits["train"])},
            "seeds": {"run": seed, "teacher": self.suite.teacher.seed,
                      "subsample": self.suite.data.subsample_seed},
            "versions": package_versions(),
            "machine": machine_info(self.accelerator),
            "config": spec,
            "config_hash": run_hash,
            "started_at": datetime.now(timezone.utc).isoformat(),
        }
        self.log(f"[run] {method_name} on {task.name}, seed {seed} -> {path}")
        started = time.perf_counter()
        try:
            record.update(self._train(method, task, prepared, teacher, seed, spec,
                                      stage_configs))
            record["status"] = "finished"
        except NonFiniteLossError as error:
            record["status"] = "failed"
            record["error"] = str(error)
            record["failure"] = {"stage": error.stage, "step": error.step,
                                 "losses": error.values}
            self.log(f"[failed] {error}")
        record["wall_seconds"] = time.perf_counter() - started
        record["finished_at"] = datetime.now(timezone.utc).isoformat()
        self.store.write(path, record)
        if record["status"] == "finished":
            ratio = record["pct_of_teacher"]
            share = f"{ratio:.1f}% of teacher" if ratio is not None else "teacher scores 0"
            self.log(f"[done] {method_name} {task.name} seed {seed}: {task.main_metric} "
                     f"{record['main_score']:.2f} ({share}) in {record['wall_seconds']:.0f}s")
        return RunOutcome(method_name, task.name, seed, record["status"], path,
                          record.get("main_score"))

    def _train(self, method: Method, task: TaskSpec, prepared: PreparedTask,
               teacher: TeacherArtifacts, seed: int, spec: dict[str, Any],
               stage_configs: dict[str, TrainConfig]) -> dict[str, Any]:
        set_seed(seed)
        shape_name, shape = self.suite.student_for(method.name)
        needs_teacher_weights = shape.init != "random" or shape.embedding_init != "random"
        context = StudentContext(
            task=task, shape_name=shape_name, shape=shape,
            teacher_config=load_base_config(self.checkpoint),
            teacher_state=self.teacher_state() if needs_teacher_weights else None)
        student = method.build_student(context)
        if hasattr(student, "config"):
            check_label_order(task, student.config, "student")
        extra = method.extra_modules(context)
        evaluator = TaskEvaluator(task)
        stage_results = []
        for stage in method.stages(task):
            runtime = self._teacher_runtime(stage, teacher, prepared)
            result = train_stage(
                method=method, stage=stage, student=student, extra=extra,
                config=stage_configs[stage.name], train_split=prepared.splits["train"],
                eval_split=prepared.splits[task.selection_split], evaluator=evaluator,
                teacher=runtime, accelerator=self.accelerator, seed=seed,
                description=f"{method.name} {task.name} s{seed} {stage.name}")
            student = self.accelerator.unwrap_model(student)
            stage_results.append(result)
        final_stage = method.stages(task)[-1]

        def forward(batch):
            return method.forward_student(student, batch, final_stage)

        dev = {}
        for split in task.dev_splits:
            logits = predict_logits(
                student, prepared.splits[split], self.accelerator,
                stage_configs[final_stage.name].eval_batch_size, forward=forward)
            dev[split] = evaluator.score(logits, prepared.splits[split].labels)
        main_score = dev[task.selection_split][task.main_metric]
        seconds = sum(result.seconds for result in stage_results)
        examples = sum(result.examples_seen for result in stage_results)
        return {
            "dev": dev,
            "main_score": main_score,
            "teacher_main_score": teacher.main_score,
            # None when the teacher scores 0 (e.g. an MCC of 0): no meaningful ratio.
            "pct_of_teacher": (100.0 * main_score / teacher.main_score
                               if teacher.main_score else None),
            "parameters": count_parameters(student),
            "extra_parameters": sum(p.numel() for p in extra.parameters()),
            "train_seconds": seconds,
            "train_examples_per_second": examples / seconds if seconds else 0.0,
            "final_losses": stage_results[-1].final_losses,
            "stages": [
                {"name": result.name, "steps": result.steps,
                 "examples_seen": result.examples_seen, "seconds": result.seconds,
                 "examples_per_second": result.examples_per_second,
                 "best_step": result.best_step, "best_metrics": result.best_metrics,
                 "final_losses": result.final_losses, "evaluations": result.evaluations,
                 "history": result.history}
                for result in stage_results
            ],
        }

    def _teacher_runtime(self, stage, teacher: TeacherArtifacts,
                         prepared: PreparedTask) -> TeacherRuntime:
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
            runtime.train_logits = teacher.logits("train")
        if live:
            attention = "eager" if "attentions" in live else None
            runtime.model = (teacher.load_model(attention) if stage.teacher == "finetuned"
                             else load_pretrained_encoder(self.checkpoint, attention))
        return runtime

    # -- many cells ----------------------------------------------------------------------
    def run(self, methods: list[str], tasks: list[str], seeds: list[int]) -> list[RunOutcome]:
        for method in methods:
            registry.get(method)
        cells = [(task, method, seed) for task in tasks for method in methods for seed in seeds]
        outcomes = []
        for index, (task, method, seed) in enumerate(cells, start=1):
            self.log(f"== cell {index}/{len(cells)}: {method} / {task} / seed {seed}")
            outcomes.append(self.run_one(method, task, seed))
        return outcomes


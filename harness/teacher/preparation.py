"""Teacher stage: fine-tune a teacher per task, cache it and its logits, check it.

Fine-tuned teachers and their logits on the training and dev splits are stored under a
content-addressed key (checkpoint identity, task, data fingerprint, hyperparameters, seed,
sequence length), so every method, seed and trial reuses them.  Two guard rails run each
time a teacher is used: its labels must be in the task's order, and it must beat the
majority-class (or mean-prediction) baseline on dev by the configured margin.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from transformers import AutoConfig, PretrainedConfig

from harness.api.method import LossTerm, Method, MethodParams, Stage
from harness.api.pooling import (
    config_pooling,
    load_sequence_classifier,
    resolve_pooling,
    with_pooling,
)
from harness.api.students import classifier_config
from harness.assets.checkpoints import (
    Checkpoint,
    TeacherError,
    check_label_order,
    load_base_config,
    load_tokenizer,
    reading,
)
from harness.common.cache import ArtifactCache
from harness.config.identity import teacher_logits_key, teacher_model_key
from harness.config.schema import Selection, TeacherConfig, TrainConfig
from harness.data.features import EncodedSplit
from harness.data.loading import single_class_problem
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import TaskSpec
from harness.teacher.outputs import TeacherRuntime, autocast_setting
from harness.training.distributed import any_process
from harness.training.engine import NonFiniteLossError, predict_logits, train_stage


class _GoldLabels(Method):
    """The teacher's fine-tuning objective (not a registered method)."""

    name = "teacher-finetune"
    loss_terms = (LossTerm("gold", "cross-entropy / MSE to gold labels"),)

    def stages(self, task: TaskSpec) -> list[Stage]:
        return [Stage("finetune", ("gold",), teacher="none", teacher_outputs=frozenset())]


@dataclass
class TeacherArtifacts:
    key: str
    path: Path
    checkpoint: Checkpoint
    task: TaskSpec
    summary: dict[str, Any]
    model_dir: Path | None = None
    """Where the fine-tuned model is, when not in this entry (a bf16 labelling of it)."""

    @property
    def model_path(self) -> Path:
        return self.model_dir or self.path / "model"

    @property
    def model_key(self) -> str:
        """The ``teachers`` entry that holds the fine-tuned model: this one, or for a bf16
        labelling the fp32 entry it labelled with."""
        return str(self.summary.get("model_key", self.key))

    @property
    def inference_precision(self) -> str:
        """Precision the cached logits were computed in (``teacher.inference_precision``)."""
        return self.summary.get("inference_precision", "fp32")

    def logits(self, split: str) -> np.ndarray:
        """The cached logits on ``split``, one of :func:`labelled_splits` (the training and
        dev splits): another split (a test split) is refused by name, whatever an entry
        written before that rule also holds, not a missing file that reads as a damaged
        cache entry."""
        labelled = labelled_splits(self.task)
        if split not in labelled:
            raise ValueError(f"the {self.task.display_name or self.task.name} teacher has no "
                             f"logits on {split!r}: it labels {', '.join(labelled)} only "
                             "(a test split's gold labels are hidden)")
        return np.load(self.path / "logits" / f"{split}.npy", mmap_mode="r")

    @property
    def dev_metrics(self) -> dict[str, dict[str, float]]:
        return self.summary["dev"]

    @property
    def main_score(self) -> float:
        return self.dev_metrics[self.task.selection_split][self.task.main_metric]

    @property
    def pooling(self) -> str:
        """What the fine-tuned teacher's head reads (BERT's pooler where the entry's
        summary names none)."""
        return self.summary.get("pooling", "pooler")

    def load_model(self, attn_implementation: str | None = None):
        kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
        return load_sequence_classifier(self.model_path, **kwargs)

    def config(self) -> PretrainedConfig:
        return AutoConfig.from_pretrained(self.model_path)


def teacher_key(checkpoint: Checkpoint, task: TaskSpec, data_fingerprint: str,
                teacher: TeacherConfig, training: TrainConfig, max_length: int,
                selection: Selection = "last") -> str:
    """The key of the teacher's cache entry (and of the run ids that use it).  fp32 logits
    (the default) keep the key they always had; other inference precisions key an entry
    of their own, which holds only the logits and points at the fp32 entry's model.
    ``selection``: the suite's checkpoint selection (``last`` is in the key, ``best-dev``
    is the key without it)."""
    key = _model_key(checkpoint, task, data_fingerprint, teacher, training, max_length,
                     selection)
    return teacher_logits_key(key, teacher.inference_precision)


def teacher_pooling(checkpoint: Checkpoint, teacher: TeacherConfig) -> str:
    """The pooling of the teacher's classification head (what a student's ``auto``
    follows): ``teacher.pooling`` with ``auto`` resolved for a head this harness fine-tunes;
    the checkpoint's own for one already fine-tuned (``finetune: false``), whose head is
    used as it is."""
    if teacher.finetune:
        return resolve_pooling(teacher.pooling, checkpoint.location, checkpoint.revision)
    own = config_pooling(load_base_config(checkpoint))
    if teacher.pooling not in ("auto", own):
        raise TeacherError(f"teacher.pooling is {teacher.pooling}, but {checkpoint.spec} is "
                           f"already fine-tuned (finetune: false) and its head reads {own}; "
                           f"set teacher.pooling to auto or {own}")
    return own


def _model_key(checkpoint: Checkpoint, task: TaskSpec, data_fingerprint: str,
               teacher: TeacherConfig, training: TrainConfig, max_length: int,
               selection: Selection) -> str:
    return teacher_model_key(
        checkpoint=checkpoint.identity, task=task.name, data=data_fingerprint,
        finetune=teacher.finetune, training=training.identity(), seed=teacher.seed,
        max_seq_length=max_length,
        pooling=teacher_pooling(checkpoint, teacher) if teacher.finetune else None,
        selection=selection)


def prepare_teacher(
    *,
    task: TaskSpec,
    splits: dict[str, EncodedSplit],
    data_fingerprint: str,
    checkpoint: Checkpoint,
    teacher: TeacherConfig,
    training: TrainConfig,
    max_length: int,
    cache: ArtifactCache,
    accelerator: Accelerator,
    selection: Selection = "last",
    log=print,
) -> TeacherArtifacts:
    """Fine-tune (or reuse) the task's teacher and its logits on the training and dev splits
    (:func:`labelled_splits`), then check it.

    Under ``accelerate launch`` every process calls this alike: they fine-tune together
    (DDP) and label the splits together, the main process of each machine writes the
    entry, and all wait for it before reading it."""
    key = teacher_key(checkpoint, task, data_fingerprint, teacher, training, max_length,
                      selection)
    model_dir = None
    if teacher.inference_precision != "fp32":
        # The fine-tuned model (and its fp32 logits) first, then this precision's logits.
        base = prepare_teacher(
            task=task, splits=splits, data_fingerprint=data_fingerprint,
            checkpoint=checkpoint, teacher=teacher.model_copy(
                update={"inference_precision": "fp32"}),
            training=training, max_length=max_length, cache=cache,
            accelerator=accelerator, selection=selection, log=log)
        model_dir = base.model_path
        if any_process(not cache.has("teachers", key), accelerator):
            log(f"[teacher] {task.name}: {teacher.inference_precision} logits of the cached "
                "teacher")
            _relabel(key, base, splits, teacher, cache, accelerator, log)
    else:
        with cache.producing("teachers", key, exclusive=accelerator.num_processes == 1):
            if any_process(not cache.has("teachers", key), accelerator):
                log(f"[teacher] {task.name}: no cached teacher; "
                    f"{'fine-tuning' if teacher.finetune else 'scoring'} {checkpoint.spec}")
                _build_teacher(key, task, splits, data_fingerprint, checkpoint, teacher,
                               training, max_length, cache, accelerator, log, selection)
    path = cache.path("teachers", key)
    summary = json.loads((path / "summary.json").read_text())
    artifacts = TeacherArtifacts(key, path, checkpoint, task, summary, model_dir)
    check_label_order(task, artifacts.config(), f"teacher {checkpoint.spec}")
    baseline = summary["baseline"][task.main_metric]
    if artifacts.main_score < baseline + teacher.min_margin:
        raise TeacherError(
            f"teacher for {task.name} scores {artifacts.main_score:.2f} {task.main_metric} on "
            f"dev, not above the majority/mean baseline {baseline:.2f} by the required "
            f"{teacher.min_margin} points (teacher.min_margin). A teacher this weak would make "
            f"every distillation result meaningless: {_weak_teacher_cause(task, splits, teacher)}"
            f" Cached at {path}.")
    return artifacts


def _weak_teacher_cause(task: TaskSpec, splits: dict[str, EncodedSplit],
                        teacher: TeacherConfig) -> str:
    """What to check when a teacher misses its margin: a training set of a single class,
    which nothing trained on it can beat the baseline with, where that is so."""
    train = splits.get("train")
    problem = (single_class_problem(task, train.labels.tolist())
               if teacher.finetune and train is not None else None)
    if problem is not None:
        return (f"its training set holds a single class ({problem}; `harness data check` "
                "names the file): give it the task's training file, or a data."
                "max_train_examples sample that holds every class.")
    return ("check the checkpoint is fine-tuned for this task and the labels, or give it "
            "more training (teacher.task_training).")


def labelled_splits(task: TaskSpec) -> tuple[str, ...]:
    """The splits a teacher labels: the training set, whose logits are the students' soft
    targets, and the dev splits it is scored on.  A test split's gold labels are hidden
    (GLUE's are), so nothing reads a teacher's logits on it: labelling RTE's 3,000 test
    pairs would cost longer than the other splits together."""
    return ("train", *task.dev_splits)


def _label_splits(model, splits, task, evaluator, teacher, accelerator):
    """The teacher's logits on the splits it labels (:func:`labelled_splits`; at its
    inference precision; a collective under DDP) and its scores on the dev splits."""
    precision = autocast_setting(teacher.inference_precision)
    labelled = labelled_splits(task)
    logits = {name: predict_logits(model, split, accelerator, teacher.inference_batch_size,
                                   precision)
              for name, split in splits.items() if name in labelled}
    dev = {name: evaluator.score(logits[name], split.labels)
           for name, split in splits.items() if name in task.dev_splits}
    return logits, dev


def _build_teacher(key, task, splits, data_fingerprint, checkpoint, teacher, training,
                   max_length, cache, accelerator, log, selection: Selection) -> None:
    evaluator = TaskEvaluator(task)
    started = time.perf_counter()
    base_config = load_base_config(checkpoint)
    if teacher.finetune:
        from accelerate.utils import set_seed

        # Seeded before the classifier head is initialised, not only before training: the
        # head's initial weights otherwise depend on whatever ran earlier in the process
        # (a test order, an earlier task), and the same key could cache different teachers.
        set_seed(teacher.seed)
        config = with_pooling(classifier_config(base_config, task),
                              teacher_pooling(checkpoint, teacher))
        with reading(checkpoint):
            model = load_sequence_classifier(checkpoint.location, config=config,
                                             **checkpoint.load_kwargs)
    else:
        with reading(checkpoint):
            model = load_sequence_classifier(checkpoint.location, **checkpoint.load_kwargs)
        check_label_order(task, model.config, f"teacher {checkpoint.spec}")
    stage_summary = None
    if teacher.finetune:
        from accelerate.utils import set_seed

        set_seed(teacher.seed)
        objective = _GoldLabels(MethodParams(), {"gold": 1.0})
        stage = objective.stages(task)[0]
        try:
            result = train_stage(
                method=objective, stage=stage, student=model, extra=torch.nn.ModuleDict(),
                config=training, train_split=splits["train"],
                eval_split=splits[task.selection_split], evaluator=evaluator,
                teacher=TeacherRuntime(), accelerator=accelerator, seed=teacher.seed,
                selection=selection, description=f"teacher {task.name}")
        except NonFiniteLossError as error:  # not the finetune method's stage of that name
            raise TeacherError(
                f"the {task.display_name} teacher ({checkpoint.spec}) diverged while it was "
                f"fine-tuned (loss at step {error.step}: {error.shown(error.values)})"
                f"; lower teacher.training.lr or teacher.task_training.{task.name}.lr "
                f"(now {training.lr:g}) and run again") from None
        model = accelerator.unwrap_model(model)
        stage_summary = {"steps": result.steps, "examples_seen": result.examples_seen,
                         "seconds": result.seconds, "selection": selection,
                         "best_step": result.best_step,
                         "evaluations": result.evaluations, "final_losses": result.final_losses}
    # The training and dev splits' logits, by every process (a collective under DDP).
    model.to(accelerator.device)
    logits, dev = _label_splits(model, splits, task, evaluator, teacher, accelerator)
    train_labels = splits["train"].labels
    summary = {
        "task": task.name,
        "checkpoint": checkpoint.spec,
        "dev": dev,
        "baseline": evaluator.baseline(train_labels, splits[task.selection_split].labels),
        "training": training.model_dump() if teacher.finetune else None,
        "seed": teacher.seed,
        "stage": stage_summary,
        "seconds": time.perf_counter() - started,
        "parameters": sum(p.numel() for p in model.parameters()),
        "inference_precision": teacher.inference_precision,
        "pooling": config_pooling(model.config),
    }
    if accelerator.num_processes > 1:
        summary["processes"] = accelerator.num_processes
    if accelerator.is_local_main_process:
        with cache.build("teachers", key, {"task": task.name, "checkpoint": checkpoint.spec,
                                           "data": data_fingerprint}) as scratch:
            model.save_pretrained(scratch / "model")
            load_tokenizer(checkpoint).save_pretrained(scratch / "model")
            (scratch / "logits").mkdir()
            for name, values in logits.items():
                np.save(scratch / "logits" / f"{name}.npy", values)
            (scratch / "summary.json").write_text(json.dumps(summary, indent=2))
    accelerator.wait_for_everyone()
    log(f"[teacher] {task.name}: dev {dev} in {summary['seconds']:.0f}s")


def _relabel(key: str, base: TeacherArtifacts, splits: dict[str, EncodedSplit],
             teacher: TeacherConfig, cache: ArtifactCache, accelerator: Accelerator,
             log) -> None:
    """An entry with the logits of ``base``'s model on the splits it labels in
    ``teacher.inference_precision`` (the model stays in ``base``'s entry)."""
    task = base.task
    evaluator = TaskEvaluator(task)
    started = time.perf_counter()
    model = base.load_model().to(accelerator.device)
    logits, dev = _label_splits(model, splits, task, evaluator, teacher, accelerator)
    summary = {**base.summary, "dev": dev, "inference_precision": teacher.inference_precision,
               "model_key": base.key, "fp32_dev": base.dev_metrics,
               "logits_seconds": time.perf_counter() - started}
    if accelerator.is_local_main_process:
        with cache.build("teachers", key, {"task": task.name, "model_key": base.key,
                                           "inference_precision":
                                               teacher.inference_precision},
                         made_from=[("teachers", base.key)]) as scratch:
            (scratch / "logits").mkdir()
            for name, values in logits.items():
                np.save(scratch / "logits" / f"{name}.npy", values)
            (scratch / "summary.json").write_text(json.dumps(summary, indent=2))
    accelerator.wait_for_everyone()
    log(f"[teacher] {task.name}: {teacher.inference_precision} logits, dev {dev} "
        f"(fp32: {base.dev_metrics})")

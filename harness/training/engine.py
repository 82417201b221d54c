"""The one training loop every method and the teacher stage run through.

Built on ``accelerate`` for device placement, distributed data parallelism and gradient
synchronisation, so the same code runs on this CPU and on multi-GPU nodes.  The loop:
AdamW with linear warm-up and decay, gradient accumulation, loss scaling under fp16,
length-bucketed dynamic padding, per-term loss logging, evaluation per epoch (or every N
steps) keeping the last or the best-scoring checkpoint (the suite's ``selection``), and a
hard stop on a non-finite loss.

:func:`train_stage` is the loop; each concern is a collaborator of its own module:

=================================================  ===========================================
:class:`~harness.training.batches.StageBatches`    the batches, their groups, the stage's length
:class:`~harness.training.forward.StepForward`     a batch through teacher and student to losses
:class:`~harness.training.optimization.Updates`    backward, clipping, optimiser and schedule
:class:`~harness.training.loss_log.LossLog`        the loss history
:class:`~harness.training.evaluation.DevEvaluation`  dev evaluation and checkpoint selection
:class:`~harness.training.stage_saves.StageSaves`  saved progress and resuming it
:mod:`harness.training.autocast`                   autocast, the fp16 loss scaler
:mod:`harness.training.distributed`                what the processes agree on and average
=================================================  ===========================================

Under ``accelerate launch`` (DDP) every process walks the same global batches and trains
on its slice of each (:func:`harness.training.distributed.local_rows`), its loss weighted by its
share of the batch: the batches, steps, epochs and schedule of a stage do not depend on
the number of processes, and for losses that average over rows the gradient is the one a
single process computes on the whole batch.  Evaluation splits every batch the same way
and gathers the logits back into row order on every process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from harness.api.method import Method, Stage
from harness.common.interrupts import raise_if_interrupted
from harness.common.progress import progress_bar
from harness.config.schema import Selection, TrainConfig
from harness.data.features import EncodedSplit
from harness.data.metrics import TaskEvaluator
from harness.training.autocast import autocast, grad_scaler, step_losses
from harness.training.batches import StageBatches
from harness.training.distributed import all_finite, weighted_by_share
from harness.training.evaluation import CheckpointSelection, DevEvaluation
from harness.training.forward import StepForward, TeacherSource, method_view
from harness.training.loss_log import LossLog
from harness.training.optimization import Updates, parameter_groups
from harness.training.prediction import predict_logits
from harness.training.results import NonFiniteLossError, StageResult
from harness.training.stage_saves import StageCheckpoint, StageSaves

__all__ = [
    "NonFiniteLossError", "StageCheckpoint", "StageResult", "TeacherSource", "autocast",
    "grad_scaler", "method_view", "parameter_groups", "predict_logits", "step_losses",
    "train_stage"]


def train_stage(
    *,
    method: Method,
    stage: Stage,
    student: nn.Module,
    extra: nn.ModuleDict,
    config: TrainConfig,
    train_split: EncodedSplit,
    eval_split: EncodedSplit | None,
    evaluator: TaskEvaluator,
    teacher: TeacherSource,
    accelerator: Accelerator,
    seed: int,
    description: str = "",
    pad_token_id: int = 0,
    task_train_size: int | None = None,
    on_evaluate: Callable[[dict[str, Any]], None] | None = None,
    on_log: Callable[[dict[str, float]], None] | None = None,
    checkpoint: StageCheckpoint | None = None,
    selection: Selection = "last",
    log: Callable[[str], None] = print,
) -> StageResult:
    """Train ``student`` (and ``extra``) for one stage; leaves the checkpoint ``selection``
    names loaded: the last (``last``) or the best dev evaluation's (``best-dev``).  The
    result records the best evaluation either way (``best_metrics``, ``best_step``), and
    every evaluation (``evaluations``), the last one at the stage's last step.

    ``on_evaluate`` sees every dev evaluation (stage, step, epoch, metrics, ``main``) as it
    happens; an exception it raises (e.g. a pruned tuning trial) stops the stage.
    ``on_log`` sees every entry of the loss history as it is added (every
    ``log_every_steps`` and at the last step): step, epoch, lr, each loss term and ``loss``,
    the weighted total (e.g. for an experiment tracker).
    ``checkpoint``: save the stage's progress there as it goes, and resume from it (one
    process only; the caller removes it once the stage's product is stored)."""
    batches = StageBatches.plan(config, train_split, accelerator, seed, pad_token_id,
                                _rows_per_epoch(config, stage, task_train_size))
    total_steps = batches.total_steps
    student, updates = Updates.prepare(student, extra, config, accelerator, total_steps)
    if config.compile:  # in place: state_dict names and the DDP wrapper stay as they are
        accelerator.unwrap_model(student).compile()
    stack = ExitStack()  # open for the stage: closed at its end, before the final clean-up
    forward = StepForward.open(method=method, stage=stage, task=evaluator.task,
                               student=student, extra=extra, teacher=teacher,
                               train_split=train_split, accelerator=accelerator,
                               precision=config.mixed_precision, stack=stack)
    chosen = CheckpointSelection(selection)
    loop = _StageLoop(
        stage=stage, student=student, extra=extra, accelerator=accelerator, seed=seed,
        batches=batches, forward=forward, updates=updates, selection=chosen,
        losses=LossLog(config.log_every_steps, total_steps, accelerator, on_log),
        evaluation=DevEvaluation(
            stage=stage, split=eval_split, evaluator=evaluator,
            every_steps=config.eval_every_steps or max(1, batches.steps_per_epoch),
            total_steps=total_steps, batch_size=config.eval_batch_size,
            accelerator=accelerator, selection=chosen, forward=forward.student,
            predict=predict_logits, on_evaluate=on_evaluate),
        saves=StageSaves(checkpoint, config, total_steps, stage.name, accelerator, log))
    loop.resume(log)
    with stack:
        loop.run(stack, description or stage.name)
    return loop.finish(compiled=config.compile)


def _rows_per_epoch(config: TrainConfig, stage: Stage, task_train_size: int | None
                    ) -> int | None:
    """The rows of an epoch: the task's training set under ``epoch_size: task`` (None: the
    split's own)."""
    if config.epoch_size != "task":
        return None
    if task_train_size is None:
        raise ValueError(f"stage {stage.name!r}: epoch_size 'task' needs the task's "
                         "training-set size")
    return task_train_size


class _StageLoop:
    """A stage's steps over its collaborators: where it is (step, epoch, batch), its
    batch generator and its result."""

    def __init__(self, *, stage: Stage, student: nn.Module, extra: nn.Module,
                 accelerator: Accelerator, seed: int, batches: StageBatches,
                 forward: StepForward, updates: Updates, losses: LossLog,
                 evaluation: DevEvaluation, selection: CheckpointSelection,
                 saves: StageSaves) -> None:
        self.stage, self.student, self.extra = stage, student, extra
        self.model = accelerator.unwrap_model(student)
        self.accelerator = accelerator
        self.batches, self.forward, self.updates = batches, forward, updates
        self.losses, self.evaluation, self.selection = losses, evaluation, selection
        self.saves = saves
        self.result = StageResult(name=stage.name)
        self.generator = torch.Generator(device=accelerator.device)
        self.generator.manual_seed(seed + accelerator.process_index)
        self.step = self.epoch = 0
        self.first_batch = 0  # batches of the current epoch trained on before a resume
        self.earlier_seconds = 0.0
        self.random_states: dict[str, Any] | None = None  # set at the resumed epoch's start
        self.started = time.perf_counter()
        self.progress: Any = None

    def resume(self, log: Callable[[str], None]) -> None:
        """Continue from the saved progress, where there is some to resume."""
        saved = self.saves.load()
        if saved is not None:
            self.model.load_state_dict(saved["student"])
            self.extra.load_state_dict(saved["extra"])
            self.updates.restore(saved)
            self.generator.set_state(saved["batch_generator"])
            self.step, self.epoch, self.first_batch = (
                saved["step"], saved["epoch"], saved["next_batch"])
            self.selection.restore(saved)
            self.losses.restore(saved["window"])
            for name, value in saved["result"].items():
                setattr(self.result, name, value)
            self.earlier_seconds = self.result.seconds
            self.random_states = saved
            log(f"[engine] {self.stage.name}: resuming at step {self.step} of "
                f"{self.batches.total_steps} from {self.saves.checkpoint.path}")
        self.saves.restart_clock()
        self.started = time.perf_counter()

    def run(self, stack: ExitStack, description: str) -> None:
        """Train to the stage's last step (``stack``: closes the progress bar however the
        stage ends, so that the runner's next line starts on a line of its own)."""
        total = self.batches.total_steps
        self.progress = progress_bar(
            total=total, desc=description, unit="step", leave=False, initial=self.step,
            disable=not self.accelerator.is_local_main_process)
        stack.callback(self.progress.close)
        self.student.train()
        self.extra.train()
        while self.step < total:
            self.batches.sampler.set_epoch(self.epoch, first_batch=self.first_batch)
            batches = iter(self.batches.loader)  # draws the loader's seed from torch's RNG
            self._restore_random_states()  # then the random state a resumed stage saved
            for index, (batch, rows, own) in enumerate(batches, start=self.first_batch):
                self._accumulate(batch, rows, own, index)
                if not self.batches.ends_group(index):
                    continue
                self.updates.step()
                self.step += 1
                self.progress.update(1)
                self._after_step(index)
                if self.step >= total:
                    break
            self.epoch += 1
            self.first_batch = 0

    def _restore_random_states(self) -> None:
        saved, self.random_states = self.random_states, None
        if saved is not None:
            torch.set_rng_state(saved["torch_rng"])
            if saved.get("cuda_rng") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(saved["cuda_rng"])

    def _accumulate(self, batch: dict[str, torch.Tensor], rows: int, own: int,
                    index: int) -> None:
        """Forward and backward of batch ``index`` of the epoch (``own`` of its ``rows``
        this process's), its gradients added to its group's."""
        raise_if_interrupted()  # a Ctrl-C Python swallowed stops the stage here
        values, loss = self.forward(batch, self.generator)
        if not all_finite(bool(torch.isfinite(loss)), self.accelerator):
            raise NonFiniteLossError(self.stage.name, self.step,
                                     {k: float(v.detach()) for k, v in values.items()})
        loss, values = weighted_by_share(loss, values, own, rows, self.accelerator)
        # The mean over the group's batches, a short last group of the epoch too.
        self.updates.backward(loss, self.batches.group_size(index))
        self.losses.add(values, loss)
        self.result.examples_seen += rows

    def _after_step(self, index: int) -> None:
        """Log, evaluate and save, each when due, after the step that batch ``index`` of
        the epoch ended."""
        epochs_done = self.batches.epochs_done(self.epoch, index)
        if self.losses.due(self.step):
            means = self.losses.write(self.result, self.step, epochs_done, self.updates.lr)
            self.progress.set_postfix({k: f"{v:.3g}" for k, v in means.items()},
                                      refresh=False)
        if self.evaluation.due(self.step):
            self.evaluation.run(self.student, self.model, self.result, self.step, epochs_done)
        if self.saves.due(self.step):
            self.result.seconds = self._seconds()
            self.saves.save(self._progress(next_batch=index + 1))

    def _progress(self, next_batch: int) -> dict[str, Any]:
        """The stage's state, as :class:`~harness.training.stage_saves.StageSaves` saves it."""
        return {
            "student": self.model.state_dict(), "extra": self.extra.state_dict(),
            **self.updates.state(),
            "batch_generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "step": self.step, "epoch": self.epoch, "next_batch": next_batch,
            **self.selection.state(), "window": self.losses.state(),
            "result": asdict(self.result)}

    def _seconds(self) -> float:
        return self.earlier_seconds + time.perf_counter() - self.started

    def finish(self, compiled: bool) -> StageResult:
        """The result, the selected checkpoint loaded (uncompiled again where the stage
        compiled it: later stages and timings decide for themselves)."""
        self.progress.close()
        self.result.steps = self.step
        self.result.seconds = self._seconds()
        if compiled:
            self.model._compiled_call_impl = None
        self.selection.load_selected(self.model)
        self.accelerator.free_memory()
        return self.result

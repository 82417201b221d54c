"""The one training loop every method and the teacher stage run through.

Built on ``accelerate`` for device placement, distributed data parallelism and gradient
synchronisation, so the same code runs on this CPU and on multi-GPU nodes.  The loop:
AdamW with linear warm-up and decay, gradient accumulation, length-bucketed dynamic
padding, per-term loss logging, evaluation per epoch (or every N steps) with best-checkpoint
selection on the task's main metric, and a hard stop on a non-finite loss.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from harness.capture import capture_attention_scores
from harness.config import TrainConfig
from harness.features import BucketBatchSampler, EncodedSplit, PaddingCollator
from harness.method import Method, Stage, StepInputs, TeacherView
from harness.metrics import TaskEvaluator
from harness.progress import progress_bar


class NonFiniteLossError(RuntimeError):
    """Training diverged; the run is stopped and recorded as failed."""

    def __init__(self, stage: str, step: int, values: dict[str, float]) -> None:
        shown = ", ".join(f"{name}={value:.4g}" for name, value in values.items())
        super().__init__(f"non-finite loss in stage {stage!r} at step {step}: {shown}")
        self.stage = stage
        self.step = step
        self.values = values


@dataclass
class StageResult:
    name: str
    steps: int = 0
    examples_seen: int = 0
    seconds: float = 0.0
    best_metrics: dict[str, float] = field(default_factory=dict)
    best_step: int | None = None
    final_losses: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def examples_per_second(self) -> float:
        return self.examples_seen / self.seconds if self.seconds else 0.0


@dataclass
class TeacherRuntime:
    """Where a stage's teacher outputs come from: cached logits and/or a live model."""

    train_logits: np.ndarray | None = None
    model: nn.Module | None = None


def autocast(accelerator: Accelerator, precision: str):
    if precision == "no":
        return torch.autocast(accelerator.device.type, enabled=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(accelerator.device.type, dtype=dtype)


def _optimizer(modules: list[nn.Module], config: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for module in modules:
        for name, parameter in module.named_parameters():
            if not parameter.requires_grad:
                continue
            if parameter.ndim < 2 or "LayerNorm" in name or name.endswith(".bias"):
                no_decay.append(parameter)
            else:
                decay.append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr)


def eval_loader(split: EncodedSplit, batch_size: int, pad_token_id: int = 0) -> DataLoader:
    sampler = BucketBatchSampler(split.lengths, batch_size, shuffle=False)
    return DataLoader(range(len(split)), batch_sampler=sampler,
                      collate_fn=PaddingCollator(split, pad_token_id))


@torch.inference_mode()
def predict_logits(model: nn.Module, split: EncodedSplit, accelerator: Accelerator,
                   batch_size: int, precision: str = "no",
                   forward=None, progress: str | None = None) -> np.ndarray:
    """Logits for every row of ``split``, in row order (``progress``: show a bar with this
    description, for long labelling passes)."""
    forward = forward or (lambda batch: model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"]))
    was_training = model.training
    model.eval()
    loader = accelerator.prepare_data_loader(eval_loader(split, batch_size))
    rows, outputs = [], []
    bar = progress_bar(total=len(loader), desc=progress, unit="batch", leave=False,
                       disable=progress is None or not accelerator.is_local_main_process)
    for batch in loader:
        bar.update(1)
        with autocast(accelerator, precision):
            logits = forward(batch).logits
        gathered_rows, gathered_logits = accelerator.gather_for_metrics(
            (batch["row"], logits.float()))
        rows.append(gathered_rows.cpu())
        outputs.append(gathered_logits.cpu())
    bar.close()
    model.train(was_training)
    ordered = torch.empty((len(split), outputs[0].shape[-1]), dtype=torch.float32)
    ordered[torch.cat(rows)] = torch.cat(outputs)
    return ordered.numpy()


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
    teacher: TeacherRuntime,
    accelerator: Accelerator,
    seed: int,
    description: str = "",
    pad_token_id: int = 0,
    task_train_size: int | None = None,
    on_evaluate: Callable[[dict[str, Any]], None] | None = None,
) -> StageResult:
    """Train ``student`` (and ``extra``) for one stage; leaves the best checkpoint loaded.

    ``on_evaluate`` sees every dev evaluation (stage, step, epoch, metrics, ``main``) as it
    happens; an exception it raises (e.g. a pruned tuning trial) stops the stage."""
    result = StageResult(name=stage.name)
    task = evaluator.task
    rows_per_epoch = None
    if config.epoch_size == "task":
        if task_train_size is None:
            raise ValueError(f"stage {stage.name!r}: epoch_size 'task' needs the task's "
                             "training-set size")
        rows_per_epoch = task_train_size
    sampler = BucketBatchSampler(train_split.lengths, config.batch_size, shuffle=True,
                                 seed=seed, rows_per_epoch=rows_per_epoch)
    loader = DataLoader(range(len(train_split)), batch_sampler=sampler,
                        collate_fn=PaddingCollator(train_split, pad_token_id))
    batches_per_epoch = len(loader)
    total_steps = math.ceil(config.epochs * batches_per_epoch / config.grad_accum_steps)
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    eval_every = config.eval_every_steps or max(1, batches_per_epoch // config.grad_accum_steps)

    optimizer = _optimizer([student, extra], config)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, int(config.warmup_ratio * total_steps), total_steps)
    student, optimizer, loader, scheduler = accelerator.prepare(
        student, optimizer, loader, scheduler)
    if any(True for _ in extra.parameters()):
        extra = accelerator.prepare(extra)
    teacher_logits = (torch.tensor(np.asarray(teacher.train_logits), dtype=torch.float32)
                      if teacher.train_logits is not None else None)
    teacher_model = teacher.model
    live_outputs = set(stage.teacher_outputs) - {"logits"}
    if live_outputs and teacher_model is None:
        raise ValueError(f"stage {stage.name!r} asks the teacher for {sorted(live_outputs)}, "
                         "which need a live teacher model; none was given")
    if teacher_model is not None:
        teacher_model.to(accelerator.device).eval()

    batch_generator = torch.Generator(device=accelerator.device)
    batch_generator.manual_seed(seed + accelerator.process_index)
    best_score = -math.inf
    best_state: dict[str, torch.Tensor] | None = None
    window: dict[str, list[torch.Tensor]] = defaultdict(list)
    step = 0
    epoch = 0
    started = time.perf_counter()
    progress = progress_bar(total=total_steps, desc=description or stage.name, unit="step",
                    disable=not accelerator.is_local_main_process, leave=False)
    student.train()
    extra.train()
    with ExitStack() as stack:
        # Entered once for the stage: every teacher forward below records its pre-softmax
        # attention scores; the teacher's attention implementation is restored on exit.
        teacher_scores = (stack.enter_context(capture_attention_scores(teacher_model))
                          if "attention_scores" in stage.teacher_outputs else None)
        while step < total_steps:
            sampler.set_epoch(epoch)
            for batch_index, batch in enumerate(loader):
                batch = method.prepare_batch(batch, stage, batch_generator)
                with autocast(accelerator, config.mixed_precision):
                    view = TeacherView()
                    if teacher_logits is not None:
                        view.logits = teacher_logits[batch["row"].cpu()].to(accelerator.device)
                    if teacher_model is not None:
                        with torch.inference_mode():
                            out = teacher_model(
                                input_ids=batch["input_ids"],
                                attention_mask=batch["attention_mask"],
                                token_type_ids=batch["token_type_ids"],
                                output_hidden_states="hidden_states" in stage.teacher_outputs,
                                output_attentions="attentions" in stage.teacher_outputs,
                            )
                        view.hidden_states = getattr(out, "hidden_states", None)
                        view.attentions = getattr(out, "attentions", None)
                        if teacher_scores is not None:
                            view.attention_scores = teacher_scores.scores
                        if view.logits is None and "logits" in stage.teacher_outputs:
                            view.logits = out.logits
                    student_out = method.forward_student(student, batch, stage)
                    inputs = StepInputs(batch=batch, student=student_out, teacher=view, task=task,
                                        stage=stage, extra=extra)
                    values = method.compute_losses(inputs)
                    loss = method.total_loss(values, stage)
                if not torch.isfinite(loss):
                    raise NonFiniteLossError(stage.name, step,
                                             {k: float(v.detach()) for k, v in values.items()})
                accelerator.backward(loss / config.grad_accum_steps)
                for name, value in values.items():
                    window[name].append(value.detach())
                window["loss"].append(loss.detach())
                result.examples_seen += int(batch["row"].shape[0]) * accelerator.num_processes
                if (batch_index + 1) % config.grad_accum_steps and batch_index + 1 < len(loader):
                    continue
                if config.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(
                        [p for group in optimizer.param_groups for p in group["params"]],
                        config.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                progress.update(1)
                if step % config.log_every_steps == 0 or step == total_steps:
                    means = {name: torch.stack(vals).float().mean().item()
                             for name, vals in window.items()}
                    result.history.append({"step": step, "epoch": epoch + batch_index /
                                           batches_per_epoch, "lr": scheduler.get_last_lr()[0],
                                           **means})
                    result.final_losses = {k: v for k, v in means.items() if k != "loss"}
                    result.final_losses["total"] = means["loss"]
                    progress.set_postfix({k: f"{v:.3g}" for k, v in means.items()}, refresh=False)
                    window.clear()
                if stage.evaluate and eval_split is not None and (
                        step % eval_every == 0 or step == total_steps):
                    logits = predict_logits(
                        student, eval_split, accelerator, config.eval_batch_size,
                        config.mixed_precision,
                        forward=lambda b: method.forward_student(student, b, stage))
                    metrics = evaluator.score(logits, eval_split.labels)
                    result.evaluations.append({"step": step, "epoch": epoch + 1, **metrics})
                    main = metrics[task.main_metric]
                    if on_evaluate is not None:
                        on_evaluate({"stage": stage.name, "step": step, "epoch": epoch + 1,
                                     "metrics": metrics, "main": main})
                    if main > best_score:
                        best_score = main
                        result.best_metrics = metrics
                        result.best_step = step
                        best_state = {k: v.detach().cpu().clone() for k, v in
                                      accelerator.unwrap_model(student).state_dict().items()}
                    student.train()
                if step >= total_steps:
                    break
            epoch += 1
    progress.close()
    result.steps = step
    result.seconds = time.perf_counter() - started
    unwrapped = accelerator.unwrap_model(student)
    if best_state is not None:
        unwrapped.load_state_dict(best_state)
    accelerator.free_memory()
    return result

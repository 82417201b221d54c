"""The one training loop every method and the teacher stage run through.

Built on ``accelerate`` for device placement, distributed data parallelism and gradient
synchronisation, so the same code runs on this CPU and on multi-GPU nodes.  The loop:
AdamW with linear warm-up and decay, gradient accumulation, loss scaling under fp16,
length-bucketed dynamic padding, per-term loss logging, evaluation per epoch (or every N
steps) keeping the last or the best-scoring checkpoint (the suite's ``selection``), and a
hard stop on a non-finite loss.

Under ``accelerate launch`` (DDP) every process walks the same global batches and trains
on its slice of each (:func:`harness.training.distributed.local_rows`), its loss weighted by its
share of the batch: the batches, steps, epochs and schedule of a stage do not depend on
the number of processes, and for losses that average over rows the gradient is the one a
single process computes on the whole batch.  Evaluation splits every batch the same way
and gathers the logits back into row order on every process.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from harness.api.method import Method, Stage, StepInputs, TeacherView
from harness.common.cache import ArtifactCache
from harness.common.devices import batch_to_device
from harness.common.interrupts import raise_if_interrupted
from harness.common.precision import to_float32
from harness.common.progress import progress_bar
from harness.config.schema import Selection, TrainConfig
from harness.data.features import (
    BucketBatchSampler,
    EncodedSplit,
    PaddingCollator,
    padding_multiple,
)
from harness.data.metrics import TaskEvaluator
from harness.training.distributed import local_rows
from harness.training.progress import (
    ProgressRefusedError,
    load_progress_file,
    save_progress_file,
)


class NonFiniteLossError(RuntimeError):
    """Training diverged; the run is stopped and recorded as failed."""

    def __init__(self, stage: str, step: int, values: dict[str, float], what: str = "loss"
                 ) -> None:
        super().__init__(f"non-finite {what} in stage {stage!r} at step {step}: "
                         f"{self.shown(values)}")
        self.stage = stage
        self.step = step
        self.values = values

    @staticmethod
    def shown(values: dict[str, float]) -> str:
        """``values`` as the message writes them: ``gold=nan, soft=1.234``."""
        return ", ".join(f"{name}={value:.4g}" for name, value in values.items())


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


@dataclass(frozen=True)
class StageCheckpoint:
    """Where a long stage keeps its progress, and how often it saves it, so that a killed
    process resumes the stage where it was instead of starting it again.  A saved state
    holds the weights, the optimiser, the schedule, the position in the epoch and every
    random state, so a resumed stage trains exactly as one that was never stopped."""

    path: Path
    every_seconds: float = 600.0
    every_steps: int | None = None
    """Save after this many steps too (None: by time only)."""
    made_from: Callable[[], Iterable[tuple[str, str]]] = tuple
    """The cache entries (kind, key) the stage reads besides its inputs (a general stage's
    :meth:`~harness.api.Method.general_made_from`), asked at each save.  With ``cache``,
    the saved state records their digests, and is not resumed once one of them holds
    another build: the resumed stage would train on a mix of the two."""
    cache: ArtifactCache | None = None

    def sources(self) -> dict[str, str | None]:
        """``kind/key`` -> digest of the files of each entry :attr:`made_from` names."""
        return self.cache.source_digests(self.made_from()) if self.cache is not None else {}

    def changed_source(self, recorded: dict[str, str | None]) -> str | None:
        """Why a state that recorded ``recorded`` (:meth:`sources` when it was saved) was
        made from entries other than the cache's now; None when each is the same build.
        One removed since counts as changed: it is made again, perhaps with other
        contents, when the stage reads it."""
        if self.cache is None:
            return None
        changed = self.cache.changed_source(recorded, removed=True)
        return f"it was saved from {changed}" if changed else None


PROGRESS_KEYS = frozenset({
    "config", "total_steps", "made_from", "student", "extra", "optimizer", "scheduler",
    "scaler", "batch_generator", "torch_rng", "cuda_rng", "step", "epoch", "next_batch",
    "best_score", "best_state", "window", "result"})
"""What a saved state holds (:func:`_save_progress`); one that lacks any is not resumed."""


def _save_progress(checkpoint: StageCheckpoint, state: dict[str, Any]) -> None:
    """Written beside, then renamed over the previous state: a kill while saving leaves
    the previous state whole (the format: :mod:`harness.training.progress`)."""
    save_progress_file(checkpoint.path, state)


def _load_progress(checkpoint: StageCheckpoint | None, config: TrainConfig, total_steps: int,
                   log: Callable[[str], None]) -> dict[str, Any] | None:
    """The state saved at ``checkpoint``, or None (with a line saying why) when there is
    none to resume: a file that is not whole saved progress of this format (a pickle of
    an older version included: never loaded), or one saved for another budget or from
    other builds of the cache entries the stage reads."""
    if checkpoint is None:
        return None
    _drop_pickled_progress(checkpoint.path, log)
    if not checkpoint.path.exists():
        return None
    try:
        state = load_progress_file(checkpoint.path)
    except ProgressRefusedError as error:
        log(f"[engine] {checkpoint.path}: {error}; starting over")
        return None
    if missing := sorted(PROGRESS_KEYS - state.keys()):
        log(f"[engine] {checkpoint.path}: saved progress without {', '.join(missing)}; "
            "starting over")
        return None
    if (state["config"] != config.model_dump(mode="json")
            or state["total_steps"] != total_steps):
        log(f"[engine] {checkpoint.path}: saved for another budget; starting over")
        return None
    recorded = state["made_from"]
    if not isinstance(recorded, dict) or (changed := checkpoint.changed_source(recorded)):
        log(f"[engine] {checkpoint.path}: {changed or 'its sources are unreadable'}; "
            "starting over")
        return None
    return state


def _drop_pickled_progress(path: Path, log: Callable[[str], None]) -> None:
    """Remove the ``.pt`` pickle an older version of the harness saved the same stage's
    progress to (beside ``path``), saying so: it is never loaded, and the stage starts
    over."""
    pickled = path.with_suffix(".pt")
    if pickled != path and pickled.is_file():
        log(f"[engine] {pickled}: saved progress in the older pickle format, which is never "
            "loaded; removed it, starting over")
        pickled.unlink(missing_ok=True)


class TeacherSource(Protocol):
    """Where a stage's teacher outputs come from: cached training-set logits, and whatever a
    live teacher or a disk cache of its intermediate outputs gives (see
    :class:`harness.teacher.outputs.TeacherRuntime`, the implementation the runner passes)."""

    train_logits: np.ndarray | None

    def open_stage(self, method: Method, stage: Stage, student: nn.Module,
                   train_split: EncodedSplit, accelerator: Accelerator, stack: ExitStack,
                   live_logits: bool
                   ) -> Callable[[dict[str, torch.Tensor], TeacherView], None] | None:
        """Prepare the stage's teacher outputs (contexts it needs enter ``stack``, which
        stays open for the stage) and return what fills a batch's view, or None when the
        stage needs nothing beyond the cached logits."""
        ...


class _DataParallelStudent:
    """The student as a method sees it under data parallelism: attributes are the model's
    own (config, embeddings, modules), calls go through the wrapper that synchronises
    gradients, so plugins never unwrap anything."""

    def __init__(self, wrapped: nn.Module, model: nn.Module) -> None:
        object.__setattr__(self, "_wrapped", wrapped)
        object.__setattr__(self, "_model", model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapped(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def method_view(student: nn.Module, model: nn.Module) -> Any:
    """``student`` (as prepared for training, ``model`` once unwrapped) as methods receive
    it (:meth:`harness.api.method.Method.forward_student`): the model itself, or a view of
    it that calls through its data-parallel wrapper."""
    return model if model is student else _DataParallelStudent(student, model)


AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast settings :func:`autocast` takes (``auto`` is resolved before, see
:mod:`harness.common.precision`)."""


def step_losses(method: Method, inputs: StepInputs, accelerator: Accelerator,
                precision: str) -> dict[str, torch.Tensor]:
    """The stage's loss terms for one batch whose forward passes ran under ``precision``'s
    autocast: computed outside it, on float32 copies of the student's outputs and the
    teacher's view, except the terms that declare ``autocast`` (:class:`~harness.api.
    LossTerm`), which run under it again."""
    inputs = dataclasses.replace(
        inputs, student=to_float32(inputs.student), teacher=to_float32(inputs.teacher),
        stage_autocast=functools.partial(autocast, accelerator, precision))
    return method.compute_losses(inputs)


def autocast(accelerator: Accelerator, precision: str):
    """Autocast to ``precision`` (``no``, ``bf16`` or ``fp16``) on the accelerator's device.

    Any other value is refused: an unresolved ``auto`` (or an inference precision such as
    ``fp32``) would otherwise have run in fp16."""
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast precision {precision!r}: expected one of "
                         f"{sorted(AUTOCAST_DTYPES)} (resolve 'auto' first)")
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return torch.autocast(accelerator.device.type, enabled=False)
    return torch.autocast(accelerator.device.type, dtype=dtype)


def grad_scaler(accelerator: Accelerator, precision: str) -> torch.amp.GradScaler | None:
    """The loss scaler fp16 training needs (None in any other precision).

    fp16's smallest normal value is about 6e-5: unscaled, the small gradients of an fp16
    backward round to zero.  The loss is scaled up before the backward, the gradients are
    unscaled before clipping, and a step whose gradients overflowed is skipped while the
    scale backs off (as ``torch.amp`` prescribes and the Hugging Face Trainer does).  bf16
    has fp32's range and needs none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(accelerator.device.type)


def parameter_groups(modules: Sequence[nn.Module], weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices, none on biases, LayerNorm and vectors."""
    decay, no_decay = [], []
    for module in modules:
        for name, parameter in module.named_parameters():
            if not parameter.requires_grad:
                continue
            if parameter.ndim < 2 or "LayerNorm" in name or name.endswith(".bias"):
                no_decay.append(parameter)
            else:
                decay.append(parameter)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def _optimizer(modules: list[nn.Module], config: TrainConfig) -> torch.optim.Optimizer:
    # fused=None (not False) leaves torch its default: a loop over the parameters on a CPU,
    # for-each kernels on a GPU.
    return torch.optim.AdamW(parameter_groups(modules, config.weight_decay), lr=config.lr,
                             fused=config.fused_optimizer or None)


def _loader(split: EncodedSplit, sampler: BucketBatchSampler, accelerator: Accelerator,
            pad_token_id: int = 0, shard: bool = True) -> DataLoader:
    """This process's share of every batch of ``sampler`` (all of it with ``shard=False``
    or in one process), with the batch's global size and how many of the rows are the
    process's own: ``(batch, size, own)``.  A DataLoader on purpose: starting one draws
    its base seed from the global RNG, and the dropout masks drawn after it depend on that
    draw, so the random stream of a run (and its recorded scores) stays reproducible."""
    collate = PaddingCollator(split, pad_token_id, multiple_of=padding_multiple(accelerator.device))

    def share(rows: list[int]) -> tuple[dict[str, torch.Tensor], int, int]:
        part, own = local_rows(rows, accelerator) if shard else (list(rows), len(rows))
        return collate(part), len(rows), own

    return DataLoader(range(len(split)), batch_sampler=sampler, collate_fn=share)


def _average_gradients(parameters: list[nn.Parameter], accelerator: Accelerator) -> None:
    """Average ``parameters``' gradients over the processes (one collective), as DDP does
    for the modules it wraps.  A parameter without a gradient on every process keeps none
    (the optimiser skips it, as it would in one process)."""
    flat = torch.cat([p.grad.detach().reshape(-1) if p.grad is not None
                      else torch.zeros(p.numel(), device=p.device, dtype=p.dtype)
                      for p in parameters]
                     + [torch.tensor([float(p.grad is not None) for p in parameters],
                                     device=parameters[0].device, dtype=parameters[0].dtype)])
    flat = accelerator.reduce(flat, "sum")
    present = flat[-len(parameters):]
    offset = 0
    for parameter, count in zip(parameters, present.tolist(), strict=True):
        size = parameter.numel()
        if count:
            parameter.grad = (flat[offset:offset + size] / accelerator.num_processes
                              ).view_as(parameter).clone()
        offset += size


@torch.inference_mode()
def predict_logits(model: nn.Module, split: EncodedSplit, accelerator: Accelerator,
                   batch_size: int, precision: str = "no",
                   forward=None, progress: str | None = None,
                   distributed: bool = True) -> np.ndarray:
    """Logits for every row of ``split``, in row order (``progress``: show a bar with this
    description, for long labelling passes).

    With several processes each computes its slice of every batch and all of them get
    every row back (a collective: every process must call it alike); ``distributed=False``
    runs the whole split in this process alone (e.g. timing)."""
    forward = forward or (lambda batch: model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"]))
    distributed = distributed and accelerator.num_processes > 1
    was_training = model.training
    model.eval()
    loader = _loader(split, BucketBatchSampler(split.lengths, batch_size, shuffle=False),
                     accelerator, shard=distributed)
    ordered: torch.Tensor | None = None
    seen = torch.zeros(len(split), dtype=torch.bool)
    bar = progress_bar(total=len(loader), desc=progress, unit="batch", leave=False,
                       disable=progress is None or not accelerator.is_local_main_process)
    for batch, rows, own in loader:
        raise_if_interrupted()
        bar.update(1)
        batch = batch_to_device(batch, accelerator.device)
        with autocast(accelerator, precision):
            logits = forward(batch).logits.float()
        indices = batch["row"]
        if distributed:
            # Equal shapes on every process for the gather: pad to the slice size with
            # row -1 (a repeated row standing in for an empty slice is dropped too).
            size = -(-rows // accelerator.num_processes)
            padded_rows = torch.full((size,), -1, dtype=torch.long, device=logits.device)
            padded_rows[:own] = indices[:own]
            padded = logits.new_zeros((size, logits.shape[-1]))
            padded[:own] = logits[:own]
            indices, logits = accelerator.gather((padded_rows, padded))
        indices, logits = indices.cpu(), logits.cpu()
        keep = indices >= 0
        if ordered is None:
            ordered = torch.empty((len(split), logits.shape[-1]), dtype=torch.float32)
        ordered[indices[keep]] = logits[keep]
        seen[indices[keep]] = True
    bar.close()
    model.train(was_training)
    if ordered is None or not bool(seen.all()):
        raise RuntimeError(f"predictions on {split.name}: {int((~seen).sum())} of "
                           f"{len(split)} rows missing")
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
    result = StageResult(name=stage.name)
    task = evaluator.task
    rows_per_epoch = None
    if config.epoch_size == "task":
        if task_train_size is None:
            raise ValueError(f"stage {stage.name!r}: epoch_size 'task' needs the task's "
                             "training-set size")
        rows_per_epoch = task_train_size
    # Global batches: every process walks the same ones and trains on its slice of each.
    sampler = BucketBatchSampler(train_split.lengths, config.batch_size, shuffle=True,
                                 seed=seed, rows_per_epoch=rows_per_epoch)
    loader = _loader(train_split, sampler, accelerator, pad_token_id)
    processes = accelerator.num_processes
    batches_per_epoch = len(loader)
    # An epoch's last group of batches steps the optimiser even when it is short, so an
    # epoch is this many steps and accumulation never carries over an epoch's end.
    steps_per_epoch = math.ceil(batches_per_epoch / config.grad_accum_steps)
    total_steps = math.ceil(config.epochs * steps_per_epoch)
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    eval_every = config.eval_every_steps or max(1, steps_per_epoch)

    optimizer = _optimizer([student, extra], config)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, int(config.warmup_ratio * total_steps), total_steps)
    # The scheduler is not prepared: accelerate would step it once per process per step,
    # for per-process batches; here a step is one global batch on any number of processes.
    student, optimizer = accelerator.prepare(student, optimizer)
    scaler = grad_scaler(accelerator, config.mixed_precision)
    if config.compile:  # in place: state_dict names and the DDP wrapper stay as they are
        accelerator.unwrap_model(student).compile()
    # The extra modules (projections) are not wrapped in DDP: methods call them directly,
    # never through a wrapper's forward, so DDP would not reduce their gradients; they are
    # averaged over the processes before each optimiser step instead.
    extra.to(accelerator.device)
    extra_parameters = [p for p in extra.parameters() if p.requires_grad]
    if processes > 1:  # and start from the main process's weights, as DDP's modules do
        for tensor in [*extra.parameters(), *extra.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)
    teacher_logits = (torch.tensor(np.asarray(teacher.train_logits), dtype=torch.float32)
                      if teacher.train_logits is not None else None)
    live_logits = "logits" in stage.teacher_outputs and teacher_logits is None
    stack = ExitStack()
    # Entered once for the stage (e.g. the teacher's attention-score capture), closed at
    # its end, and before any dev evaluation's preparation can leak into the timing.
    fill_teacher = teacher.open_stage(method, stage, accelerator.unwrap_model(student),
                                      train_split, accelerator, stack, live_logits)
    seen_by_method = method_view(student, accelerator.unwrap_model(student))

    batch_generator = torch.Generator(device=accelerator.device)
    batch_generator.manual_seed(seed + accelerator.process_index)
    best_score = -math.inf
    best_state: dict[str, torch.Tensor] | None = None
    window: dict[str, list[torch.Tensor]] = defaultdict(list)
    step = 0
    epoch = 0
    resume_batch = 0  # batches of the current epoch already trained on before a resume
    earlier_seconds = 0.0
    if checkpoint is not None and processes > 1:
        log(f"[engine] {stage.name}: saved progress is for one process; not saving")
        checkpoint = None
    saved = _load_progress(checkpoint, config, total_steps, log)
    if saved is not None:
        accelerator.unwrap_model(student).load_state_dict(saved["student"])
        extra.load_state_dict(saved["extra"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        if scaler is not None and saved.get("scaler") is not None:
            scaler.load_state_dict(saved["scaler"])
        batch_generator.set_state(saved["batch_generator"])
        step, epoch, resume_batch = saved["step"], saved["epoch"], saved["next_batch"]
        best_score, best_state = saved["best_score"], saved["best_state"]
        window = defaultdict(list, {name: [value.to(accelerator.device) for value in values]
                                    for name, values in saved["window"].items()})
        for name, value in saved["result"].items():
            setattr(result, name, value)
        earlier_seconds = result.seconds
        log(f"[engine] {stage.name}: resuming at step {step} of {total_steps} from "
            f"{checkpoint.path}")
    last_save = time.perf_counter()
    started = time.perf_counter()
    progress = progress_bar(total=total_steps, desc=description or stage.name, unit="step",
                    disable=not accelerator.is_local_main_process, leave=False,
                    initial=step)
    # Closed however the stage ends (a diverged loss, Ctrl-C): the line the runner logs next
    # starts on a line of its own, not after the bar.
    stack.callback(progress.close)
    student.train()
    extra.train()
    with stack:
        while step < total_steps:
            sampler.set_epoch(epoch, first_batch=resume_batch)
            batches = iter(loader)  # draws the loader's seed from torch's generator
            if saved is not None:  # then the random state the stage was saved with
                torch.set_rng_state(saved["torch_rng"])
                if saved.get("cuda_rng") is not None and torch.cuda.is_available():
                    torch.cuda.set_rng_state_all(saved["cuda_rng"])
                saved = None
            for batch_index, (batch, rows, own) in enumerate(batches, start=resume_batch):
                raise_if_interrupted()  # a Ctrl-C Python swallowed stops the stage here
                batch = batch_to_device(batch, accelerator.device)
                batch = method.prepare_batch(batch, stage, batch_generator)
                with autocast(accelerator, config.mixed_precision):
                    view = TeacherView()
                    if teacher_logits is not None:
                        view.logits = teacher_logits[batch["row"].cpu()].to(accelerator.device)
                    if fill_teacher is not None:
                        fill_teacher(batch, view)
                    student_out = method.forward_student(seen_by_method, batch, stage)
                inputs = StepInputs(batch=batch, student=student_out, teacher=view, task=task,
                                    stage=stage, extra=extra)
                values = step_losses(method, inputs, accelerator, config.mixed_precision)
                loss = method.total_loss(values, stage)
                finite = bool(torch.isfinite(loss))
                if processes > 1:  # all stop together, or the others wait in backward
                    finite = not bool(accelerator.reduce(torch.tensor(
                        [0.0 if finite else 1.0], device=accelerator.device), "sum").item())
                if not finite:
                    raise NonFiniteLossError(stage.name, step,
                                             {k: float(v.detach()) for k, v in values.items()})
                if processes > 1:
                    # DDP averages the processes' gradients; weighting each by its share
                    # of the batch makes that the gradient of the whole batch's mean loss
                    # (and the logged mean over processes its value).
                    share = own * processes / rows
                    loss = loss * share
                    values = {name: value * share for name, value in values.items()}
                # The mean over the group's batches, a short last group of the epoch too.
                group_start = batch_index - batch_index % config.grad_accum_steps
                group_size = min(config.grad_accum_steps, batches_per_epoch - group_start)
                scaled = loss / group_size
                accelerator.backward(scaled if scaler is None else scaler.scale(scaled))
                for name, value in values.items():
                    window[name].append(value.detach())
                window["loss"].append(loss.detach())
                result.examples_seen += rows
                if (batch_index + 1) % config.grad_accum_steps and batch_index + 1 < len(loader):
                    continue
                if processes > 1 and extra_parameters:
                    _average_gradients(extra_parameters, accelerator)
                if scaler is not None:  # clipping reads the true gradients
                    scaler.unscale_(optimizer)
                if config.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(
                        [p for group in optimizer.param_groups for p in group["params"]],
                        config.max_grad_norm)
                if scaler is None:
                    optimizer.step()
                else:  # skipped where the gradients overflowed; the schedule goes on
                    scaler.step(optimizer)
                    scaler.update()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                progress.update(1)
                epochs_done = epoch + (batch_index + 1) / batches_per_epoch
                if step % config.log_every_steps == 0 or step == total_steps:
                    means = {name: torch.stack(vals).float().mean().item()
                             for name, vals in window.items()}
                    if processes > 1:  # the mean over processes, the same on all
                        names = list(means)
                        reduced = accelerator.reduce(torch.tensor(
                            [means[name] for name in names], device=accelerator.device), "mean")
                        means = dict(zip(names, reduced.tolist(), strict=True))
                    result.history.append({"step": step, "epoch": epochs_done,
                                           "lr": scheduler.get_last_lr()[0], **means})
                    result.final_losses = {k: v for k, v in means.items() if k != "loss"}
                    result.final_losses["total"] = means["loss"]
                    if on_log is not None:
                        on_log(result.history[-1])
                    progress.set_postfix({k: f"{v:.3g}" for k, v in means.items()}, refresh=False)
                    window.clear()
                if stage.evaluate and eval_split is not None and (
                        step % eval_every == 0 or step == total_steps):
                    # fp32 whatever the steps train in: the best checkpoint is chosen by,
                    # and records, the scores a plain load of it reproduces.
                    logits = predict_logits(
                        student, eval_split, accelerator, config.eval_batch_size, "no",
                        forward=lambda b: method.forward_student(seen_by_method, b, stage))
                    if not np.isfinite(logits).all():  # diverged: no score from these
                        raise NonFiniteLossError(stage.name, step, {
                            "values": float(np.sum(~np.isfinite(logits)))}, what="dev logits")
                    metrics = evaluator.score(logits, eval_split.labels)
                    result.evaluations.append({"step": step, "epoch": epochs_done, **metrics})
                    main = metrics[task.main_metric]
                    if on_evaluate is not None:
                        on_evaluate({"stage": stage.name, "step": step, "epoch": epochs_done,
                                     "metrics": metrics, "main": main})
                    if main > best_score:
                        best_score = main
                        result.best_metrics = metrics
                        result.best_step = step
                        if selection == "best-dev":
                            best_state = {k: v.detach().cpu().clone() for k, v in
                                          accelerator.unwrap_model(student).state_dict().items()}
                    student.train()
                if checkpoint is not None and step < total_steps and (
                        time.perf_counter() - last_save >= checkpoint.every_seconds
                        or (checkpoint.every_steps and step % checkpoint.every_steps == 0)):
                    result.seconds = earlier_seconds + time.perf_counter() - started
                    _save_progress(checkpoint, {
                        "config": config.model_dump(mode="json"), "total_steps": total_steps,
                        "made_from": checkpoint.sources(),
                        "student": accelerator.unwrap_model(student).state_dict(),
                        "extra": extra.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "scaler": scaler.state_dict() if scaler is not None else None,
                        "batch_generator": batch_generator.get_state(),
                        "torch_rng": torch.get_rng_state(),
                        "cuda_rng": (torch.cuda.get_rng_state_all()
                                     if torch.cuda.is_available() else None),
                        "step": step, "epoch": epoch,
                        "next_batch": batch_index + 1, "best_score": best_score,
                        "best_state": best_state, "window": dict(window),
                        "result": asdict(result)})
                    last_save = time.perf_counter()
                if step >= total_steps:
                    break
            epoch += 1
            resume_batch = 0
    progress.close()
    result.steps = step
    result.seconds = earlier_seconds + time.perf_counter() - started
    unwrapped = accelerator.unwrap_model(student)
    if config.compile:  # uncompiled again: later stages and timings decide for themselves
        unwrapped._compiled_call_impl = None
    if best_state is not None:
        unwrapped.load_state_dict(best_state)
    accelerator.free_memory()
    return result

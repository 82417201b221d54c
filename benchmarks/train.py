"""Training-step benchmark: the harness's TinyBERT intermediate step against a minimal
hand-written PyTorch loop and against TextBrewer, measured side by side in one run.

``python -m benchmarks train`` times three sides on identical tensors:

* ``harness``: the real thing: the ``tinybert`` plugin's ``intermediate`` stage (embedding,
  attention-score and hidden losses, its learnable projections, the suite's layer mapping)
  driven by :func:`harness.training.engine.train_stage` (teacher forward under inference_mode,
  ``forward_student``, loss terms, backward, clipping, AdamW, the linear schedule, loss
  logging, the progress bar, and its data path: length-bucketed batches collated per
  step).  The engine is not modified: the stage runs with ``max_steps`` and the method's
  ``prepare_batch`` hook (a no-op for TinyBERT, called once per step with the collated
  batch) is wrapped to stamp the clock.  One engine step is the interval from one call of
  the hook to the next, so it includes fetching and collating the next batch.
* ``minimal``: :class:`MinimalLoop`, plain PyTorch: the same teacher and student modules
  and projections (copies of the same starting weights), the same score capture
  (:func:`harness.api.capture.capture_attention_scores`, entered once), the same MSE
  arithmetic, AdamW with the same parameter groups, the same linear schedule, the same
  gradient clipping, and nothing else.  It steps on the tensors the engine collated.
* ``textbrewer``: ``scripts/textbrewer_step.py`` in its own environment
  (``.venv-textbrewer``, ``make bench-env``), a subprocess that configures TextBrewer's
  ``GeneralDistiller`` for the same losses and steps on the same tensors (saved to a file
  each round).  See that script for how its steps are timed.

Rounds are interleaved in one process invocation: after warm-up steps on every side, each
round runs ``steps`` engine steps, then the minimal loop and TextBrewer on exactly the
batches the engine just used, so machine load falls on every side alike.  The ratios are
paired: for each timed batch the harness's time over the other side's on that same batch;
the figure reported is the median over batches (target: harness / minimal <= 1.10,
harness / TextBrewer <= 1.00).  Every side seeds torch's generator before its first step,
so with identical weights, batch and dropout masks the first-step losses agree: they are
printed as a check that the three sides compute the same thing.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from harness.api.capture import capture_attention_scores
from harness.api.method import Method, Stage
from harness.common.files import write_text_atomic
from harness.config.schema import StudentConfig, TrainConfig
from harness.data.features import EncodedSplit
from harness.training.engine import parameter_groups

REPO_ROOT = Path(__file__).resolve().parents[1]
TEXTBREWER_SCRIPT = REPO_ROOT / "scripts" / "textbrewer_step.py"
DEFAULT_TEXTBREWER_ENV = REPO_ROOT / ".venv-textbrewer"
METHOD = "tinybert"
STAGE = "intermediate"
TARGETS = {"minimal": 1.10, "textbrewer": 1.00}
"""Upper bounds of harness time / other side's time."""
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TrainBenchError(ValueError):
    """The benchmark cannot run as asked; the message says what to do instead."""


@dataclass(frozen=True)
class TrainBenchSettings:
    suite: str = "glue-cpu"
    task: str = "mrpc"
    batch_size: int = 32
    steps: int = 3
    """Timed steps per side per round."""
    warmup: int = 2
    """Untimed steps per side before the first round."""
    rounds: int = 10
    seq: int | None = None
    """Every row exactly this many tokens (no padding); None: real batches, dynamically
    padded to their longest row by the harness's collator."""
    teacher_outputs: str = "live"
    textbrewer: bool = True
    textbrewer_env: Path = DEFAULT_TEXTBREWER_ENV
    seed: int = 0
    threads: int | None = None
    data_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "steps", "rounds"):
            if getattr(self, name) < 1:
                raise TrainBenchError(f"--{name.replace('_', '-')} must be at least 1, got "
                                      f"{getattr(self, name)}")
        if self.warmup < 0:
            raise TrainBenchError(f"--warmup cannot be negative, got {self.warmup}")
        if self.seq is not None and self.seq < 2:
            raise TrainBenchError(f"--seq must be at least 2 tokens, got {self.seq}")
        if self.threads is not None and self.threads < 1:
            raise TrainBenchError(f"--threads must be at least 1, got {self.threads}")
        if self.teacher_outputs not in ("live", "cached"):
            raise TrainBenchError(f"--teacher-outputs must be live or cached, got "
                                  f"{self.teacher_outputs!r}")
        if self.teacher_outputs == "cached":
            raise TrainBenchError(
                "--teacher-outputs cached is not supported by `bench train`: it times the "
                "intermediate stage with a live teacher forward each step (the stage's "
                "default); a cached variant would need the minimal loop and TextBrewer fed "
                "the same stored hidden states and scores (use live)")

    @property
    def total_steps(self) -> int:
        """Steps each side is configured for (schedule length): the warm-up, the timed
        steps, and the engine step whose start ends the last timing."""
        return self.warmup + self.rounds * self.steps + 1

    def textbrewer_python(self) -> Path:
        python = Path(self.textbrewer_env) / "bin" / "python"
        if not python.exists():
            raise TrainBenchError(
                f"the TextBrewer environment is missing ({python} not found): build it "
                "with `make bench-env`, point --textbrewer-env at one, or pass "
                "--no-textbrewer to time the harness against the minimal loop only")
        return python


@dataclass
class BenchSetup:
    """Everything the three sides start from."""

    method: Method
    stage: Stage
    config: TrainConfig
    split: EncodedSplit
    teacher: nn.Module
    student: nn.Module
    extra: nn.ModuleDict
    mapping: list[int]
    lambdas: list[float]
    weights: dict[str, float]
    describe: dict[str, Any] = field(default_factory=dict)
    pad_token_id: int = 0


# -- set-up ------------------------------------------------------------------------------
def fixed_length_split(split: EncodedSplit, length: int) -> EncodedSplit:
    """Every row exactly ``length`` tokens: its first token ([CLS]), then the rest of its
    tokens repeated or cut to fill the length (real token ids, no padding)."""
    def fit(row: np.ndarray) -> np.ndarray:
        return np.concatenate([row[:1], np.resize(row[1:], length - 1)]).astype(np.int64)

    return replace(split, name=f"{split.name}@{length}",
                   input_ids=[fit(row) for row in split.input_ids],
                   token_type_ids=[fit(row) for row in split.token_type_ids],
                   lengths=np.full(len(split), length, dtype=np.int64), texts=None)


def build_setup(settings: TrainBenchSettings, overrides: list[str] | None = None,
                log: Callable[[str], None] = print) -> BenchSetup:
    """The suite's TinyBERT intermediate stage on ``settings.task``'s training split: the
    teacher checkpoint as a sequence classifier (its head freshly initialised: the step's
    arithmetic does not depend on fine-tuning), the suite's student built and initialised
    by the plugin, the plugin's projections."""
    from accelerate.utils import set_seed
    from transformers import AutoModelForSequenceClassification

    from harness.api.context import StudentContext
    from harness.api.registry import instantiate, typed_student_shape
    from harness.api.students import classifier_config, resolve_teacher_sizes
    from harness.assets.checkpoints import load_base_config, load_tokenizer, resolve_checkpoint
    from harness.common.cli_options import recipe_overrides
    from harness.data.features import encode_split
    from harness.data.loading import load_task
    from harness.data.tasks import get_task
    from harness.experiments.suites import load_suite

    suite = load_suite(settings.suite, recipe_overrides(overrides, settings.data_dir, None))
    task = get_task(settings.task)
    recipe = suite.recipe(METHOD)
    method = instantiate(METHOD, recipe, task.name)
    if method.params.shared_projection:
        raise TrainBenchError("the benchmark matches TextBrewer's one projection per "
                              "intermediate match; shared_projection: true has no equivalent")
    stages = {stage.name: stage for stage in method.stages(task)}
    if STAGE not in stages:
        raise TrainBenchError(f"{settings.suite}'s {METHOD} recipe has no {STAGE!r} stage "
                              f"(stages: {', '.join(stages)}); nothing to time")
    stage = stages[STAGE]
    config = suite.train_config(task.name, *recipe.stage_overrides(task.name, STAGE))
    checkpoint = resolve_checkpoint(suite.teacher.checkpoint)
    log(f"[bench train] {suite.name} / {task.name}: loading data and the teacher "
        f"({suite.teacher.checkpoint})")
    data_config = suite.data
    data = load_task(task, source=data_config.source, data_dir=data_config.dir,
                     max_train_examples=data_config.max_train_examples.get(task.name),
                     subsample_seed=data_config.subsample_seed, test_splits=False)
    tokenizer = load_tokenizer(checkpoint)
    max_length = data_config.max_seq_length.pair if task.is_pair \
        else data_config.max_seq_length.single
    split = encode_split("train", data.splits["train"], task, tokenizer, max_length)
    base = load_base_config(checkpoint)
    if settings.seq is not None:
        if settings.seq > base.max_position_embeddings:
            raise TrainBenchError(f"--seq {settings.seq} exceeds the teacher's "
                                  f"{base.max_position_embeddings} positions")
        split = fixed_length_split(split, settings.seq)
    set_seed(settings.seed)
    teacher = AutoModelForSequenceClassification.from_pretrained(
        checkpoint.location, config=classifier_config(base, task), **checkpoint.load_kwargs)
    shape_name = suite.student_name(recipe)
    shape = typed_student_shape(shape_name, suite.students[shape_name])
    if isinstance(shape, StudentConfig):
        shape = resolve_teacher_sizes(shape, base, shape_name)
    context = StudentContext(task=task, shape_name=shape_name, shape=shape,
                             teacher_config=base,
                             teacher_state=teacher.state_dict())
    set_seed(settings.seed)
    student = method.build_student(context)
    extra = method.extra_modules(context)
    mapping = method.params.mapping
    from harness.api.layer_mapping import layer_map, layer_weights

    mapping = layer_map(student.config.num_hidden_layers, base.num_hidden_layers, mapping)
    lambdas = layer_weights(student.config.num_hidden_layers, method.params.layer_weights)
    weights = {term: method.stage_weights(stage).get(term, 0.0)
               for term in ("embedding", "attention", "hidden")}
    describe = {
        "suite": suite.name, "task": task.name, "method": METHOD, "stage": STAGE,
        "student": shape_name, "teacher": suite.teacher.checkpoint,
        "teacher_head": "checkpoint encoder, freshly initialised classifier head",
        "rows": len(split), "max_length": max_length,
    }
    return BenchSetup(method=method, stage=stage, config=config, split=split,
                      teacher=teacher, student=student, extra=extra, mapping=mapping,
                      lambdas=lambdas, weights=weights, describe=describe,
                      pad_token_id=getattr(base, "pad_token_id", 0) or 0)


def stage_config(setup: BenchSetup, settings: TrainBenchSettings) -> TrainConfig:
    """The stage's recipe (lr, weight decay, warm-up ratio, clipping, logging) with the
    benchmark's batch size and exactly ``settings.total_steps`` optimiser steps, in fp32:
    the minimal loop and TextBrewer step in fp32, so the engine does too (a suite's
    ``mixed_precision``, ``auto`` in glue-cpu, is not the benchmark's)."""
    values = setup.config.model_dump()
    values.update(batch_size=settings.batch_size, max_steps=settings.total_steps,
                  epochs=1e6, epoch_size="data", grad_accum_steps=1, eval_every_steps=None,
                  mixed_precision="no")
    return TrainConfig.model_validate(values)


def schedule_warmup(config: TrainConfig) -> int:
    """Warm-up steps of the linear schedule, as
    :func:`harness.training.engine.train_stage` sets it."""
    return int(config.warmup_ratio * config.max_steps)


# -- the minimal loop --------------------------------------------------------------------
def linear_schedule(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Linear warm-up to the peak, then linear decay to 0 at ``total_steps``."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return float(step) / float(max(1, warmup_steps))
        return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))
    return factor


class MinimalLoop:
    """The TinyBERT intermediate step in plain PyTorch, and nothing else.

    ``projections`` maps a student layer (0 = embeddings, 1..M) to its projection d' -> d;
    ``mapping[m - 1]`` is the teacher layer of student layer m; ``lambdas`` and ``weights``
    are the layer weights and the embedding / attention / hidden term weights.
    """

    def __init__(self, teacher: nn.Module, student: nn.Module, projections: nn.ModuleDict,
                 mapping: Sequence[int], lambdas: Sequence[float], weights: dict[str, float],
                 config: TrainConfig, device: torch.device, seed: int = 0) -> None:
        self.teacher = teacher.to(device).eval()
        self.student = student.to(device).train()
        self.projections = projections.to(device).train()
        self.mapping = list(mapping)
        self.lambdas = list(lambdas)
        self.weights = weights
        self.max_grad_norm = config.max_grad_norm
        self.device = device
        self.seed = seed
        self.steps = 0
        self.first_losses: dict[str, float] | None = None
        self._stack = ExitStack()
        self.teacher_scores = self._stack.enter_context(capture_attention_scores(self.teacher))
        self.student_scores = self._stack.enter_context(capture_attention_scores(self.student))
        self.optimizer = torch.optim.AdamW(
            parameter_groups([self.student, self.projections], config.weight_decay),
            lr=config.lr)
        self.parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_schedule(schedule_warmup(config), config.max_steps))

    def close(self) -> None:
        self._stack.close()

    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids, mask, types = (batch[name] for name in INPUTS)
        with torch.inference_mode():
            teacher = self.teacher(input_ids=ids, attention_mask=mask, token_type_ids=types,
                                   output_hidden_states=True)
        teacher_hidden, teacher_scores = teacher.hidden_states, self.teacher_scores.scores
        student = self.student(input_ids=ids, attention_mask=mask, token_type_ids=types,
                               output_hidden_states=True)
        student_hidden, student_scores = student.hidden_states, self.student_scores.scores
        tokens = mask.bool()  # real tokens; pairs of real tokens for the attention maps
        pairs = tokens[:, None, None, :] & tokens[:, None, :, None]
        heads = student_scores[0].shape[1] if student_scores else 1
        values = {}
        if self.weights["embedding"]:
            values["embedding"] = self.lambdas[0] * F.mse_loss(
                self.projections["embedding"](student_hidden[0][tokens]),
                teacher_hidden[0][tokens])
        if self.weights["attention"]:  # squared error summed over real pairs / their count
            count = pairs.sum() * heads
            values["attention"] = sum(
                self.lambdas[m] * torch.where(pairs, student_scores[m - 1]
                                              - teacher_scores[g - 1], 0.0).square().sum()
                / count
                for m, g in enumerate(self.mapping, start=1))
        if self.weights["hidden"]:
            values["hidden"] = sum(
                self.lambdas[m] * F.mse_loss(self.projections[f"hidden{m}"](
                    student_hidden[m][tokens]), teacher_hidden[g][tokens])
                for m, g in enumerate(self.mapping, start=1))
        return values

    def step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.steps == 0:
            torch.manual_seed(self.seed)  # the dropout masks of the other sides' first step
        values = self.losses(batch)
        loss = sum(self.weights[name] * value for name, value in values.items())
        loss.backward()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.first_losses is None:
            self.first_losses = {name: float(value.detach()) for name, value in values.items()}
            self.first_losses["total"] = float(loss.detach())
        self.steps += 1
        return values

    def run(self, batches: Sequence[dict[str, torch.Tensor]]) -> list[float]:
        times = []
        for batch in batches:
            started = _clock(self.device)
            self.step(batch)
            times.append(_clock(self.device) - started)
        return times


# -- TextBrewer --------------------------------------------------------------------------
def textbrewer_setup(setup: BenchSetup, config: TrainConfig, device: torch.device,
                     output_dir: Path, seed: int) -> dict[str, Any]:
    """What scripts/textbrewer_step.py builds its side from (``torch.save``-able)."""
    layers = {0: "embedding", **{m: f"hidden{m}" for m in range(1, len(setup.mapping) + 1)}}
    extra = getattr(setup.extra, "module", setup.extra)
    return {
        "teacher_config": setup.teacher.config.to_json_string(),
        "teacher_state": {k: v.detach().cpu().clone()
                          for k, v in setup.teacher.state_dict().items()},
        "student_config": setup.student.config.to_json_string(),
        "student_state": {k: v.detach().cpu().clone()
                          for k, v in setup.student.state_dict().items()},
        "projections": {layer: {k: v.detach().cpu().clone()
                                for k, v in extra[name].state_dict().items()}
                        for layer, name in layers.items() if name in extra},
        "mapping": list(setup.mapping), "lambdas": list(setup.lambdas),
        "weights": dict(setup.weights),
        "optim": {"lr": config.lr, "weight_decay": config.weight_decay,
                  "warmup_steps": schedule_warmup(config), "total_steps": config.max_steps,
                  "max_grad_norm": (config.max_grad_norm if config.max_grad_norm is not None
                                    else -1.0)},
        "device": str(device), "output_dir": str(output_dir), "seed": seed,
    }


class TextBrewerProcess:
    """scripts/textbrewer_step.py serving rounds in the TextBrewer environment."""

    def __init__(self, python: Path, setup: dict[str, Any], workdir: Path,
                 threads: int) -> None:
        self.workdir = workdir
        self.first_losses: dict[str, float] | None = None
        self._count = 0
        setup_path = workdir / "textbrewer-setup.pt"
        torch.save(setup, setup_path)
        self.log_path = workdir / "textbrewer.log"
        self._log = self.log_path.open("w")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
        self._process = subprocess.Popen(
            [str(python), str(TEXTBREWER_SCRIPT), "serve", "--setup", str(setup_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            env=env, cwd=workdir)
        self.versions = self._read()
        self.versions.pop("ready", None)

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait()
            self._log.flush()
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-15:]
            raise TrainBenchError("the TextBrewer side stopped (exit code "
                                  f"{code}); its last output:\n" + "\n".join(tail))
        return json.loads(line)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message) + "\n")
        self._process.stdin.flush()

    def run(self, batches: Sequence[dict[str, torch.Tensor]]) -> list[float]:
        path = self.workdir / f"batches-{self._count}.pt"
        self._count += 1
        torch.save([{name: batch[name].cpu() for name in INPUTS} for batch in batches], path)
        self._send({"batches": str(path)})
        reply = self._read()
        path.unlink()
        self.first_losses = reply.get("losses")
        return reply["times"]

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._send({"stop": True})
                self._process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        self._log.close()


# -- the harness side and the interleaving -----------------------------------------------
def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class _Finished(Exception):
    """Raised from the engine's per-step hook once every round is done."""


class Interleaver:
    """Wraps the method's ``prepare_batch`` (called by the engine once per step with the
    collated batch): times every engine step, and after the warm-up and after each round
    runs the other sides on the very batches the engine just used.

    Engine step i is timed from the end of the hook's call for step i to the start of its
    call for step i + 1; the engine is stopped (``_Finished``) from the call that ends the
    last timed step, so exactly ``warmup + rounds * steps`` engine steps run in full."""

    def __init__(self, warmup: int, steps: int, rounds: int,
                 others: dict[str, Callable[[Sequence[dict[str, torch.Tensor]]], list[float]]],
                 device: torch.device, seed: int,
                 log: Callable[[str], None] = lambda message: None) -> None:
        self.warmup, self.steps, self.rounds = warmup, steps, rounds
        self.others = others
        self.device = device
        self.seed = seed
        self.log = log
        self.batches: list[dict[str, torch.Tensor]] = []
        self.times: dict[str, list[float]] = {"harness": [], **{name: [] for name in others}}
        self._started: float | None = None

    def _run_others(self, batches: list[dict[str, torch.Tensor]], timed: bool) -> None:
        for name, run in self.others.items():
            times = run(batches)
            if timed:
                self.times[name].extend(times)

    def wrap(self, prepare: Callable) -> Callable:
        def prepare_batch(batch, stage, generator):
            now = _clock(self.device)
            index = len(self.batches)  # the engine step about to start
            if index > self.warmup:
                self.times["harness"].append(now - self._started)
            done = index - self.warmup
            if index == self.warmup and self.warmup:
                self._run_others(self.batches, timed=False)
            if done > 0 and done % self.steps == 0:
                self._run_others(self.batches[index - self.steps:index], timed=True)
                self.log(f"[bench train] round {done // self.steps}/{self.rounds} done")
            if done == self.rounds * self.steps:
                raise _Finished
            batch = prepare(batch, stage, generator)
            self.batches.append({name: batch[name] for name in INPUTS})
            if index == 0:
                torch.manual_seed(self.seed)  # the dropout masks of the other sides' first step
            self._started = _clock(self.device)
            return batch
        return prepare_batch


def run_harness(setup: BenchSetup, config: TrainConfig, interleaver: Interleaver,
                accelerator, seed: int) -> dict[str, float]:
    """Run the engine on the stage until the interleaver stops it; returns the first
    step's loss values (the method's ``compute_losses`` is wrapped for that one call)."""
    from harness.data.metrics import TaskEvaluator
    from harness.data.tasks import get_task
    from harness.teacher.outputs import TeacherRuntime
    from harness.training.engine import train_stage

    method = setup.method
    first: dict[str, float] = {}
    compute = method.compute_losses

    def compute_losses(inputs):
        values = compute(inputs)
        first.update({name: float(value.detach()) for name, value in values.items()})
        first["total"] = float(method.total_loss(values, inputs.stage).detach())
        del method.compute_losses  # only the first step is recorded
        return values

    method.prepare_batch = interleaver.wrap(method.prepare_batch)
    method.compute_losses = compute_losses
    try:
        train_stage(method=method, stage=setup.stage, student=setup.student,
                    extra=setup.extra, config=config, train_split=setup.split,
                    eval_split=None, evaluator=TaskEvaluator(get_task(setup.describe["task"])),
                    teacher=TeacherRuntime(model=setup.teacher), accelerator=accelerator,
                    seed=seed, description="bench train: harness",
                    pad_token_id=setup.pad_token_id)
    except _Finished:
        pass
    else:
        raise RuntimeError("the engine stopped before the benchmark's last round")
    finally:
        for name in ("prepare_batch", "compute_losses"):
            method.__dict__.pop(name, None)
    return first


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"host": socket.gethostname(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average": [round(value, 2) for value in load] if load else None,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def run_benchmark(setup: BenchSetup, settings: TrainBenchSettings,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time the three sides, interleaved; returns the record (see :func:`summary_lines`)."""
    from importlib.metadata import version

    import transformers
    from accelerate import Accelerator

    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    python = settings.textbrewer_python() if settings.textbrewer else None
    accelerator = Accelerator()
    device = accelerator.device
    config = stage_config(setup, settings)
    started_at = dt.datetime.now(dt.timezone.utc)
    machine = machine_info()
    stack = ExitStack()
    with stack:
        # Copies of the same starting weights for every side, taken before any trains.
        projections = copy.deepcopy(getattr(setup.extra, "module", setup.extra))
        minimal = MinimalLoop(copy.deepcopy(setup.teacher), copy.deepcopy(setup.student),
                              projections, setup.mapping, setup.lambdas, setup.weights,
                              config, device, seed=settings.seed)
        stack.callback(minimal.close)
        others: dict[str, Callable] = {"minimal": minimal.run}
        textbrewer = None
        if python is not None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="bench-train-")))
            log("[bench train] starting the TextBrewer side")
            textbrewer = TextBrewerProcess(
                python, textbrewer_setup(setup, config, device, workdir / "out", settings.seed),
                workdir, torch.get_num_threads())
            stack.callback(textbrewer.close)
            others["textbrewer"] = textbrewer.run
        interleaver = Interleaver(settings.warmup, settings.steps, settings.rounds, others,
                                  device, settings.seed, log)
        log(f"[bench train] {settings.warmup} warm-up + {settings.rounds} x {settings.steps} "
            f"timed steps per side, sides: harness, {', '.join(others)}")
        harness_first = run_harness(setup, config, interleaver, accelerator, settings.seed)
        first_losses = {"harness": harness_first, "minimal": minimal.first_losses}
        versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "accelerate": version("accelerate")}
        if textbrewer is not None:
            first_losses["textbrewer"] = textbrewer.first_losses
            versions["textbrewer_env"] = textbrewer.versions
    timed = interleaver.batches[settings.warmup:]
    widths = [int(batch["input_ids"].shape[1]) for batch in timed]
    real = [float(batch["attention_mask"].float().mean()) for batch in timed]
    machine["load_average_end"] = (
        [round(value, 2) for value in os.getloadavg()] if hasattr(os, "getloadavg") else None)
    return {
        "kind": "bench-train",
        "date": started_at.isoformat(timespec="seconds"),
        "seconds": (dt.datetime.now(dt.timezone.utc) - started_at).total_seconds(),
        "settings": {"suite": settings.suite, "task": settings.task,
                     "batch_size": settings.batch_size, "steps": settings.steps,
                     "warmup": settings.warmup, "rounds": settings.rounds,
                     "seq": settings.seq, "teacher_outputs": settings.teacher_outputs,
                     "seed": settings.seed},
        "setup": {**setup.describe, "mapping": setup.mapping, "lambdas": setup.lambdas,
                  "weights": setup.weights, "lr": config.lr,
                  "weight_decay": config.weight_decay, "max_grad_norm": config.max_grad_norm,
                  "schedule_steps": config.max_steps,
                  "schedule_warmup": schedule_warmup(config)},
        "machine": {**machine, "device": str(device)},
        "versions": versions,
        "shapes": {"batch_size": settings.batch_size, "padded_lengths": widths,
                   "real_token_share": real},
        "times": interleaver.times,
        "first_losses": first_losses,
        "summary": summarise(interleaver.times, settings.batch_size),
    }


# -- figures -----------------------------------------------------------------------------
def summarise(times: dict[str, list[float]], batch_size: int) -> dict[str, Any]:
    """Per side: median and quartiles of the step time, examples/s; paired ratios."""
    sides = {}
    for name, values in times.items():
        array = np.asarray(values, dtype=np.float64)
        q1, median, q3 = np.percentile(array, [25, 50, 75]) if len(array) else (np.nan,) * 3
        sides[name] = {"steps": len(array), "median_ms": 1e3 * median, "q1_ms": 1e3 * q1,
                       "q3_ms": 1e3 * q3, "total_s": float(array.sum()),
                       "examples_per_second": (batch_size * len(array) / array.sum()
                                               if len(array) else 0.0)}
    ratios = {}
    harness = np.asarray(times.get("harness", []), dtype=np.float64)
    for name, target in TARGETS.items():
        if name not in times or not len(times[name]):
            continue
        other = np.asarray(times[name], dtype=np.float64)
        paired = harness / other
        q1, median, q3 = np.percentile(paired, [25, 50, 75])
        ratios[name] = {"paired_median": float(median), "paired_q1": float(q1),
                        "paired_q3": float(q3),
                        "total_ratio": float(harness.sum() / other.sum()),
                        "target": target, "met": bool(median <= target)}
    return {"sides": sides, "ratios": ratios}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The printed report: set-up, per-side timings, ratios with targets and verdicts."""
    settings, setup, machine = record["settings"], record["setup"], record["machine"]
    shapes, summary = record["shapes"], record["summary"]
    widths = shapes["padded_lengths"]
    if settings["seq"]:
        shape = f"{settings['batch_size']} x {settings['seq']} tokens, no padding"
    else:
        shape = (f"{settings['batch_size']} rows, real {setup['task']} batches padded to "
                 f"their longest row: length {min(widths)}-{max(widths)} (median "
                 f"{int(np.median(widths))}), {100 * np.mean(shapes['real_token_share']):.0f}% "
                 "real tokens")
    load = machine.get("load_average")
    load_end = machine.get("load_average_end")
    versions = record["versions"]
    tb = versions.get("textbrewer_env")
    lines = [
        f"TinyBERT intermediate step, {setup['suite']} / {setup['task']}: student "
        f"{setup['student']}, teacher {setup['teacher']} (live forward each step), mapping "
        f"{setup['mapping']}",
        f"shapes: {shape}; every side steps on the same tensors",
        f"rounds: {settings['warmup']} warm-up + {settings['rounds']} x {settings['steps']} "
        "timed steps per side, interleaved (harness, minimal"
        f"{', textbrewer' if tb else ''} per round)",
        f"machine: {machine['host']}, {machine['cpu_count']} cores, {machine['device']}, "
        f"{machine['torch_threads']} torch thread(s), load average "
        f"{' '.join(map(str, load)) if load else '?'} at start, "
        f"{' '.join(map(str, load_end)) if load_end else '?'} at end; {record['date']}",
        f"versions: torch {versions['torch']}, transformers {versions['transformers']}"
        + (f"; TextBrewer env: textbrewer {tb['textbrewer']}, torch {tb['torch']}, "
           f"transformers {tb['transformers']}, {tb['threads']} thread(s)" if tb else ""),
        "",
        f"{'side':<12}{'median ms/step':>16}{'IQR ms':>20}{'examples/s':>12}",
    ]
    for name, side in summary["sides"].items():
        iqr = f"{side['q1_ms']:.0f}-{side['q3_ms']:.0f}"
        lines.append(f"{name:<12}{side['median_ms']:>16.1f}{iqr:>20}"
                     f"{side['examples_per_second']:>12.2f}")
    lines += ["", f"{'ratio (paired per batch)':<26}{'median':>8}{'IQR':>14}{'of totals':>11}"
              f"{'target':>9}  verdict"]
    labels = {"minimal": "harness / minimal", "textbrewer": "harness / TextBrewer"}
    for name, ratio in summary["ratios"].items():
        iqr = f"{ratio['paired_q1']:.3f}-{ratio['paired_q3']:.3f}"
        lines.append(f"{labels[name]:<26}{ratio['paired_median']:>8.3f}{iqr:>14}"
                     f"{ratio['total_ratio']:>11.3f}{'<= ' + format(ratio['target'], '.2f'):>9}"
                     f"  {'PASS' if ratio['met'] else 'MISS'}")
    for name in TARGETS:
        if name not in summary["ratios"]:
            lines.append(f"{labels[name]:<26}{'not run':>8}")
    lines += ["", "first-step losses (same weights, batch and dropout seed on every side):"]
    for name, losses in record["first_losses"].items():
        if losses:
            shown = ", ".join(f"{term} {value:.6g}" for term, value in losses.items())
            lines.append(f"  {name:<11} {shown}")
    return lines


def run_train_bench(settings: TrainBenchSettings, overrides: list[str] | None = None,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the set-up from the suite and time it (the ``python -m benchmarks train`` command)."""
    if settings.textbrewer:
        settings.textbrewer_python()  # a missing environment stops before any loading
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    setup = build_setup(settings, overrides, log)
    return run_benchmark(setup, settings, log)


def write_record(record: dict[str, Any], path: Path) -> Path:
    return write_text_atomic(path, json.dumps(record, indent=2, default=str))


if __name__ == "__main__":  # pragma: no cover
    print("use `python -m benchmarks train`", file=sys.stderr)

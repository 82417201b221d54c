"""Teacher outputs of a distillation step: only what the stage reads, live or from disk.

* Precision of the cached teacher logits (``teacher.inference_precision``: fp32 or bf16
  autocast) and the measurement behind its default,
  ``python -m benchmarks teacher-precision`` (benchmarks/teacher_precision.py, outside
  the core).
* The live teacher forward of a training step, :func:`live_teacher_outputs`.  A method that
  declares the teacher layers a stage reads (:meth:`harness.api.method.Method.teacher_layers`,
  a :class:`TeacherLayers`) gets a forward that stops after the deepest of them
  (:func:`forward_to_depth`: no later layers, no pooler, no classifier), with attention
  scores captured for those layers only; the other entries of the view are None.
* An opt-in disk cache of those intermediate outputs (``teacher.intermediate_cache``):
  :func:`prepare_intermediates` computes the hidden states and attention scores of the
  layers read in fp16, each row unpadded (a flat array; row offsets from the lengths), as
  memory-mapped ``.npy`` files in the content-addressed cache, one entry per (teacher and
  its logits precision, rows, output, layer), built in one teacher pass for whatever is
  missing; it logs the size of what it is about to write (from the token counts) and
  refuses past ``max_gb``.  :class:`CachedIntermediates` then serves a batch's rows,
  padded on the fly, in place of the live forward.  Keys hold the teacher, the rows' token
  ids and the layer, never the student, seed or loss weights: every seed, trial and
  ablation reading a layer shares its entry (an ablation that reads fewer layers or a
  mapping that shares some builds nothing or only the layers it lacks).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from harness.api.capture import ScoreCapture, capture_attention_scores, transformer_layers
from harness.api.method import (
    SELF_ATTENTION_OUTPUTS,
    Method,
    Stage,
    TeacherLayers,
    TeacherView,
    stage_layers,
)
from harness.common.cache import ArtifactCache
from harness.common.devices import batch_to_device
from harness.config.identity import INTERMEDIATES_KIND, intermediates_key
from harness.data.features import (
    BucketBatchSampler,
    EncodedSplit,
    PaddingCollator,
    padding_multiple,
)

if TYPE_CHECKING:
    from accelerate import Accelerator

INFERENCE_PRECISIONS = {"fp32": "no", "bf16": "bf16"}
"""``teacher.inference_precision`` -> the autocast setting of
:func:`harness.training.engine.autocast`."""

CACHEABLE_OUTPUTS = frozenset({"hidden_states", "attention_scores"})


def autocast_setting(precision: str) -> str:
    if precision not in INFERENCE_PRECISIONS:
        raise ValueError(f"inference precision {precision!r}: expected one of "
                         f"{sorted(INFERENCE_PRECISIONS)}")
    return INFERENCE_PRECISIONS[precision]


def _autocast(device: torch.device, precision: str):
    if autocast_setting(precision) == "no":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16)


# -- the live forward -----------------------------------------------------------------------
class _Stop(Exception):
    """Raised by a hook after the deepest layer needed: ends the forward there."""


def _model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "token_type_ids": batch.get("token_type_ids")}


def forward_to_depth(model: nn.Module, batch: dict[str, torch.Tensor], hidden: Iterable[int],
                     depth: int) -> dict[int, torch.Tensor]:
    """Run ``model`` up to the end of Transformer layer ``depth`` and no further; return
    the hidden states ``hidden`` asks for (0 = the first layer's input, the embedding
    output; n = layer n's output), the same tensors ``output_hidden_states`` gives.  Hooks
    of a :func:`capture_attention_scores` block see the layers that ran (finish it with
    :meth:`ScoreCapture.finish_early`)."""
    layers = transformer_layers(model)
    if not 0 <= depth <= len(layers):
        raise ValueError(f"depth {depth}: the model has {len(layers)} layers")
    wanted = set(hidden)
    if any(not 0 <= n <= depth for n in wanted):
        raise ValueError(f"hidden states {sorted(wanted)} beyond depth {depth}")
    found: dict[int, torch.Tensor] = {}

    def before_first(_module, args, kwargs):
        if 0 in wanted:
            found[0] = args[0] if args else kwargs["hidden_states"]
        if depth == 0:
            raise _Stop

    def after(number: int):
        def hook(_module, _args, output):
            if number in wanted:
                found[number] = output[0] if isinstance(output, tuple) else output
            if number == depth:
                raise _Stop
        return hook

    hooks = [layers[0].register_forward_pre_hook(before_first, with_kwargs=True)]
    hooks += [module.register_forward_hook(after(number))
              for number, module in enumerate(layers[:depth], start=1)]
    try:
        model(**_model_inputs(batch))
    except _Stop:
        pass
    else:
        raise RuntimeError("the teacher forward ran past its last layer without stopping")
    finally:
        for hook in hooks:
            hook.remove()
    return found


def stops_early(model: nn.Module) -> bool:
    """Whether :func:`forward_to_depth` can stop ``model`` after a layer (its layers' outputs
    are its hidden states); otherwise the whole model runs."""
    try:
        transformer_layers(model)
    except TypeError:
        return False
    return True


def live_teacher_outputs(model: nn.Module, batch: dict[str, torch.Tensor], stage: Stage,
                         view: TeacherView, layers: TeacherLayers | None,
                         scores: ScoreCapture | None, need_logits: bool) -> None:
    """Fill ``view`` with the stage's live teacher outputs for ``batch`` (call without
    autograd).  Without declared ``layers``, or when the logits or softmax attentions must
    come from this forward, the whole model runs; otherwise the forward stops after
    ``layers.depth`` and only the declared entries are filled."""
    outputs = stage.teacher_outputs
    if layers is None or need_logits or "attentions" in outputs or not stops_early(model):
        out = model(**_model_inputs(batch),
                    output_hidden_states="hidden_states" in outputs,
                    output_attentions="attentions" in outputs)
        view.hidden_states = getattr(out, "hidden_states", None)
        view.attentions = getattr(out, "attentions", None)
        if scores is not None:
            if "attention_scores" in outputs:
                view.attention_scores = scores.by_layer()
            _fill_projections(view, scores)
        if need_logits:
            view.logits = out.logits
        return
    num_layers = model.config.num_hidden_layers
    found = forward_to_depth(model, batch, layers.hidden, layers.depth)
    if "hidden_states" in outputs:
        view.hidden_states = tuple(found.get(n) for n in range(num_layers + 1))
    if scores is not None:
        scores.finish_early(layers.depth)
        if "attention_scores" in outputs:
            view.attention_scores = scores.by_layer()
        _fill_projections(view, scores)


def _fill_projections(view: TeacherView, captured: ScoreCapture) -> None:
    for name in captured.record:  # queries, keys, values
        setattr(view, name, captured.by_layer(name))


# -- the disk cache -------------------------------------------------------------------------
class IntermediateCacheTooLarge(ValueError):
    """The entry would exceed ``teacher.intermediate_cache.max_gb`` or the free disk."""


@dataclass(frozen=True)
class IntermediateCacheRequest:
    """Set by the runner on a stage's :class:`harness.training.engine.TeacherRuntime` when the suite
    enables ``teacher.intermediate_cache``."""

    cache: ArtifactCache
    teacher_key: str
    max_gb: float
    precision: str = "fp32"
    batch_size: int = 128
    log: Callable[[str], None] = print
    model_key: str | None = None
    """The ``teachers`` entry holding the model the outputs come from (None: none to
    check): its arrays count as damaged once that entry is rebuilt with other weights."""


def split_digest(split: EncodedSplit) -> str:
    """What the teacher sees of ``split``: every row's token ids and token types, in order."""
    digest = hashlib.sha256()
    digest.update(np.asarray(split.lengths, dtype=np.int64).tobytes())
    if len(split):
        digest.update(np.concatenate(split.input_ids).astype(np.int64).tobytes())
        digest.update(np.concatenate(split.token_type_ids).astype(np.int64).tobytes())
    return digest.hexdigest()


def array_key(teacher_key: str, rows: str, precision: str, what: str, number: int) -> str:
    """Key of one cached array: one output (``hidden`` or ``scores``) of one teacher layer
    on one set of rows (``rows``: :func:`split_digest`).  Layer by layer, so stages and
    ablations that read some of the same layers share those entries."""
    return intermediates_key(teacher_key=teacher_key, rows=rows, precision=precision,
                             output=what, layer=number)


def _arrays(layers: TeacherLayers) -> list[tuple[str, int]]:
    return ([("hidden", n) for n in sorted(layers.hidden)]
            + [("scores", n) for n in sorted(layers.scores)])


def estimate_bytes(lengths: np.ndarray, layers: TeacherLayers, hidden_size: int,
                   heads: int) -> dict[str, int]:
    """Bytes of the cached arrays of ``layers`` (fp16, unpadded rows), from the token
    counts alone."""
    lengths = np.asarray(lengths, dtype=np.int64)
    tokens, pairs = int(lengths.sum()), int((lengths ** 2).sum())
    hidden = 2 * len(layers.hidden) * tokens * hidden_size
    scores = 2 * len(layers.scores) * heads * pairs
    return {"tokens": tokens, "hidden": hidden, "scores": scores, "total": hidden + scores}


def _size(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{int(value)} B"


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])


def cacheable(method: Method, stage: Stage, layers: TeacherLayers | None,
              live_logits: bool) -> str | None:
    """Why the stage's teacher outputs cannot come from the disk cache (None: they can)."""

    if stage.is_general:
        return "general distillation reads each corpus row about once: nothing to reuse"
    if live_logits:
        return "the stage needs the teacher's logits from a live forward"
    unsupported = set(stage.teacher_outputs) - CACHEABLE_OUTPUTS - {"logits"}
    if unsupported:
        return f"{sorted(unsupported)} are not cached (hidden states and scores are)"
    if type(method).prepare_batch is not Method.prepare_batch:
        return f"{method.name} rewrites its batches, so the teacher's inputs vary"
    if layers is not None and not layers.hidden and not layers.scores:
        return "the stage reads no teacher layer"
    return None


def prepare_intermediates(request: IntermediateCacheRequest, model: nn.Module,
                          split: EncodedSplit, layers: TeacherLayers | None,
                          accelerator: Accelerator) -> CachedIntermediates:
    """The cached hidden states and attention scores of ``layers`` on every row of
    ``split``; the arrays not cached yet are computed in one teacher pass (by the main
    process of each machine, the others wait), then all are opened memory-mapped.
    ``layers`` None: every layer."""
    num_layers = model.config.num_hidden_layers
    if layers is None:
        layers = TeacherLayers(frozenset(range(num_layers + 1)),
                               frozenset(range(1, num_layers + 1)))
    rows = split_digest(split)
    keys = {array: array_key(request.teacher_key, rows, request.precision, *array)
            for array in _arrays(layers)}
    cache = request.cache
    with accelerator.local_main_process_first():
        missing = {array: key for array, key in keys.items()
                   if not cache.has(INTERMEDIATES_KIND, key)}
        if missing:
            _build(request, missing, len(keys), model, split, accelerator.device)
    return CachedIntermediates({array: cache.path(INTERMEDIATES_KIND, key)
                                for array, key in keys.items()}, split)


def _build(request: IntermediateCacheRequest, missing: dict[tuple[str, int], str],
           wanted: int, model: nn.Module, split: EncodedSplit, device: torch.device) -> None:
    """Compute the ``missing`` arrays (of ``wanted`` in all) in one teacher pass over
    ``split`` and write each as its own cache entry."""
    config = model.config
    width, heads = config.hidden_size, config.num_attention_heads
    build = TeacherLayers(frozenset(n for what, n in missing if what == "hidden"),
                          frozenset(n for what, n in missing if what == "scores"))
    lengths = np.asarray(split.lengths, dtype=np.int64)
    size = estimate_bytes(lengths, build, width, heads)
    _check_space(request, split, build, size, wanted - len(missing))
    started = time.perf_counter()
    offsets = {"hidden": _offsets(lengths), "scores": _offsets(heads * lengths ** 2)}
    model.to(device).eval()
    with ExitStack() as entries:
        outputs: dict[tuple[str, int], np.ndarray] = {}
        scratches: dict[tuple[str, int], Path] = {}
        for (what, number), key in missing.items():
            shape = (size["tokens"], width) if what == "hidden" else (int(offsets[what][-1]),)
            scratch = entries.enter_context(request.cache.build(
                INTERMEDIATES_KIND, key, {"teacher": request.teacher_key, "split": split.name,
                                          "rows": len(split), "output": what,
                                          "layer": number},
                made_from=[("teachers", request.model_key)] if request.model_key else ()))
            np.save(scratch / "lengths.npy", lengths)
            outputs[what, number] = np.lib.format.open_memmap(
                scratch / "values.npy", mode="w+", dtype=np.float16, shape=shape)
            scratches[what, number] = scratch
        _teacher_pass(request, model, split, build, device, outputs, offsets)
        seconds = time.perf_counter() - started
        for (what, number), array in outputs.items():
            array.flush()
            (scratches[what, number] / "summary.json").write_text(json.dumps({
                "output": what, "layer": number, "rows": len(split), "split": split.name,
                "tokens": size["tokens"], "hidden_size": width, "heads": heads,
                "num_layers": config.num_hidden_layers, "precision": request.precision,
                "dtype": "float16", "bytes": int(array.nbytes), "seconds": seconds},
                indent=2))
        del outputs
    request.log(f"[teacher cache] {split.name}: {len(missing)} arrays written in "
                f"{seconds:.0f}s")


def _check_space(request: IntermediateCacheRequest, split: EncodedSplit, build: TeacherLayers,
                 size: dict[str, int], reused: int) -> None:
    """Say what is about to be written; refuse it over ``max_gb`` or the disk's free space.
    ``reused``: how many other arrays of the request are cached already."""
    others = f"; {reused} other arrays already cached" if reused > 0 else ""
    request.log(
        f"[teacher cache] {split.name}: {len(split)} rows, {size['tokens']} tokens; hidden "
        f"states of layers {sorted(build.hidden)} {_size(size['hidden'])} + attention "
        f"scores of layers {sorted(build.scores)} {_size(size['scores'])} = "
        f"{_size(size['total'])} to write (fp16; limit {request.max_gb:g} GB){others}")
    if size["total"] > request.max_gb * 1e9:
        raise IntermediateCacheTooLarge(
            f"the teacher's intermediate outputs on {split.name} ({len(split)} rows) would "
            f"take {_size(size['total'])} on disk, over teacher.intermediate_cache.max_gb = "
            f"{request.max_gb:g} GB (hidden states {_size(size['hidden'])}, attention scores "
            f"{_size(size['scores'])}). Raise max_gb, make fewer augmented copies, or set "
            "teacher.intermediate_cache.enabled: false (the teacher then runs live each step)")
    request.cache.root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(request.cache.root).free
    if size["total"] > free:
        raise IntermediateCacheTooLarge(
            f"the teacher's intermediate outputs on {split.name} need {_size(size['total'])}; "
            f"{request.cache.root} has {_size(free)} free")


def _teacher_pass(request: IntermediateCacheRequest, model: nn.Module, split: EncodedSplit,
                  build: TeacherLayers, device: torch.device,
                  outputs: dict[tuple[str, int], np.ndarray],
                  offsets: dict[str, np.ndarray]) -> None:
    """Run the teacher over ``split`` in length buckets, up to the deepest layer wanted, and
    write every row's hidden states and attention scores into ``outputs`` as fp16."""
    lengths = np.asarray(split.lengths, dtype=np.int64)
    collate = PaddingCollator(split, multiple_of=padding_multiple(device))
    with ExitStack() as stack:
        capture = (stack.enter_context(capture_attention_scores(model, sorted(build.scores)))
                   if build.scores else None)
        stack.enter_context(torch.inference_mode())
        for rows in BucketBatchSampler(lengths, request.batch_size, shuffle=False):
            batch = batch_to_device(collate(rows), device)
            with _autocast(device, request.precision):
                found = forward_to_depth(model, batch, build.hidden, build.depth)
            tensors = {("hidden", n): found[n] for n in build.hidden}
            if capture is not None:
                capture.finish_early(build.depth)
                tensors.update({("scores", n): capture.layer(n) for n in build.scores})
            for (what, number), tensor in tensors.items():
                _store_rows(tensor, what, number, rows, lengths, outputs[what, number],
                            offsets[what])


def _store_rows(tensor: torch.Tensor, what: str, number: int, rows: Sequence[int],
                lengths: np.ndarray, target: np.ndarray, starts: np.ndarray) -> None:
    """One batch's output of one layer, each row cut to its length and stored as fp16 at its
    offset; a value fp16 cannot hold is an error naming the row."""
    # fp32 until the padding (the mask's dtype minimum) is cut away
    values = tensor.float().cpu().numpy()
    for position, row in enumerate(rows):
        length = int(lengths[row])
        part = (values[position, :length] if what == "hidden"
                else values[position, :, :length, :length].reshape(-1))
        with np.errstate(over="ignore"):  # caught just below
            part = part.astype(np.float16)
        if not np.isfinite(part).all():
            raise OverflowError(f"teacher {what} of layer {number} overflow "
                                f"fp16 on row {row}: cannot cache them")
        target[starts[row]:starts[row + 1]] = part


class CachedIntermediates:
    """Cached arrays of one split, memory-mapped: serves a batch's rows padded to the
    batch width as fp32 tensors (padding holds zeros; the losses read real tokens only)."""

    def __init__(self, paths: dict[tuple[str, int], Path], split: EncodedSplit) -> None:
        if not paths:
            raise ValueError("no cached teacher outputs to open")
        self.paths = paths
        expected = np.asarray(split.lengths, dtype=np.int64)
        self.hidden: dict[int, np.ndarray] = {}
        self.scores: dict[int, np.ndarray] = {}
        summary: dict[str, Any] = {}
        for (what, number), path in paths.items():
            if not np.array_equal(np.load(path / "lengths.npy"), expected):
                raise ValueError(f"teacher cache {path} does not hold the rows of {split.name}")
            summary = json.loads((path / "summary.json").read_text())
            target = self.hidden if what == "hidden" else self.scores
            target[number] = np.load(path / "values.npy", mmap_mode="r")
        self.lengths = expected
        self.num_layers = int(summary["num_layers"])
        self.heads = int(summary["heads"])
        self.hidden_size = int(summary["hidden_size"])
        self.token_offsets = _offsets(self.lengths)
        self.score_offsets = _offsets(self.heads * self.lengths ** 2)

    @property
    def layers(self) -> TeacherLayers:
        return TeacherLayers(frozenset(self.hidden), frozenset(self.scores))

    @property
    def bytes(self) -> int:
        return sum(int(array.nbytes) for array in [*self.hidden.values(), *self.scores.values()])

    def fill(self, view: TeacherView, batch: dict[str, torch.Tensor],
             outputs: Iterable[str]) -> None:
        """Put the hidden states and scores of ``batch["row"]`` into ``view``, as the
        live forward would (None for layers not cached)."""
        rows = batch["row"].cpu().numpy()
        mask = batch["attention_mask"]
        size, width = mask.shape
        lengths = self.lengths[rows]
        if not np.array_equal(mask.sum(dim=1).cpu().numpy(), lengths):
            raise ValueError("a batch's rows do not match the cached teacher outputs")
        device = mask.device
        outputs = set(outputs)
        if "hidden_states" in outputs:
            states: list[torch.Tensor | None] = [None] * (self.num_layers + 1)
            for number, array in self.hidden.items():
                padded = np.zeros((size, width, self.hidden_size), dtype=np.float32)
                for position, row in enumerate(rows):
                    padded[position, :lengths[position]] = \
                        array[self.token_offsets[row]:self.token_offsets[row + 1]]
                states[number] = torch.from_numpy(padded).to(device)
            view.hidden_states = tuple(states)
        if "attention_scores" in outputs:
            scores: list[torch.Tensor | None] = [None] * self.num_layers
            for number, array in self.scores.items():
                padded = np.zeros((size, self.heads, width, width), dtype=np.float32)
                for position, row in enumerate(rows):
                    length = int(lengths[position])
                    padded[position, :, :length, :length] = array[
                        self.score_offsets[row]:self.score_offsets[row + 1]].reshape(
                            self.heads, length, length)
                scores[number - 1] = torch.from_numpy(padded).to(device)
            view.attention_scores = scores


def uses_intermediate_cache(method: Method, stage: Stage) -> bool:
    """Whether ``stage`` reads its teacher outputs from the disk cache when it is on."""
    live = set(stage.teacher_outputs) - {"logits"}
    return (stage.teacher == "finetuned" and bool(live)
            and cacheable(method, stage, None, live_logits=False) is None)


def intermediate_cache_spec(teacher: Any, method: Method, stages: Iterable[Stage]
                            ) -> dict[str, Any]:
    """What a run's id records of the cache (``teacher``: the suite's TeacherConfig):
    nothing unless it is on and one of the stages reads from it (fp16 teacher targets),
    so runs without it keep their ids."""
    if not teacher.intermediate_cache.enabled:
        return {}
    used = [stage.name for stage in stages if uses_intermediate_cache(method, stage)]
    return {"intermediate_cache": {"dtype": "float16", "stages": used}} if used else {}


def intermediate_cache_request(teacher: Any, cache: ArtifactCache, artifacts: Any,
                               log: Callable[[str], None]) -> IntermediateCacheRequest | None:
    """The request for a stage's runtime (``teacher``: the suite's TeacherConfig,
    ``artifacts``: the task's TeacherArtifacts); None when the cache is off."""
    config = teacher.intermediate_cache
    if not config.enabled:
        return None
    return IntermediateCacheRequest(cache=cache, teacher_key=artifacts.key,
                                    max_gb=config.max_gb,
                                    precision=artifacts.inference_precision,
                                    batch_size=teacher.inference_batch_size, log=log,
                                    model_key=artifacts.model_key)


# -- a stage's teacher --------------------------------------------------------------------
@dataclass
class TeacherRuntime:
    """Where a stage's teacher outputs come from: cached logits and/or a live model (the
    :class:`harness.training.engine.TeacherSource` the runner hands the engine)."""

    train_logits: np.ndarray | None = None
    model: nn.Module | None = None
    intermediate_cache: IntermediateCacheRequest | None = None
    """Serve the stage's hidden states / attention scores from the disk cache (built on
    first use) instead of a live forward, where the stage allows it."""
    precision: str | None = None
    """The live forward's precision (``fp32`` / ``bf16``): the fine-tuned teacher's
    ``teacher.inference_precision``, which its cached logits and intermediate outputs are
    computed in too, whatever autocast the student trains under. None: the stage's own
    (the pre-trained teacher of a general stage, whose precision is the stage's and enters
    the general checkpoint's key)."""

    def open_stage(self, method: Method, stage: Stage, student: nn.Module,
                   train_split: EncodedSplit, accelerator: Any, stack: ExitStack,
                   live_logits: bool
                   ) -> Callable[[dict[str, torch.Tensor], TeacherView], None] | None:
        live_outputs = set(stage.teacher_outputs) - {"logits"}
        model = self.model
        if live_outputs and model is None:
            raise ValueError(f"stage {stage.name!r} asks the teacher for "
                             f"{sorted(live_outputs)}, which need a live teacher model; "
                             "none was given")
        if model is None:
            return None
        model.to(accelerator.device).eval()
        # Only the teacher layers the method reads (None: all), live or from the disk cache.
        layers = (stage_layers(method, stage, model.config.num_hidden_layers, student)
                  if live_outputs else None)
        intermediates = None
        if self.intermediate_cache is not None and live_outputs:
            reason = cacheable(method, stage, layers, live_logits)
            if reason is None:
                intermediates = prepare_intermediates(self.intermediate_cache, model,
                                                      train_split, layers, accelerator)
            else:
                self.intermediate_cache.log(f"[teacher cache] stage {stage.name}: live "
                                            f"teacher ({reason})")
        if intermediates is not None:
            return lambda batch, view: intermediates.fill(view, batch, stage.teacher_outputs)
        # Every teacher forward of the stage records its pre-softmax attention scores (and the
        # query / key / value vectors asked for); the teacher's attention implementation is
        # restored when the stage's stack closes.
        inside = stage.teacher_outputs & SELF_ATTENTION_OUTPUTS
        scores = (stack.enter_context(capture_attention_scores(
            model, sorted(layers.scores) if layers else None,
            record=inside - {"attention_scores"})) if inside else None)

        precision = self.precision
        device = accelerator.device

        def fill(batch: dict[str, torch.Tensor], view: TeacherView) -> None:
            # no_grad, not inference_mode: the outputs enter the loss's autograd graph as
            # constants, which inference tensors cannot.
            with torch.no_grad(), (_autocast(device, precision) if precision is not None
                                   else nullcontext()):
                live_teacher_outputs(model, batch, stage, view, layers, scores, live_logits)

        return fill

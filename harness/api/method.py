"""The method plugin API.

A method is one module in ``methods/`` (or a third-party package registered under the
``harness.methods`` entry-point group) defining a :class:`Method` subclass decorated with
:func:`register_method`.  It declares:

* ``Params``: its hyperparameters (a pydantic model; unknown keys are errors);
* ``loss_terms``: named loss terms, each computed by a ``loss_<name>`` method and weighted
  by :meth:`Method.default_weights` (a recipe may override a weight or disable a term);
* :meth:`Method.stages`: the training stages, each naming its data, its teacher (fine-tuned,
  pre-trained or none), the teacher outputs it needs and the loss terms it uses;
* :meth:`Method.build_student`, :meth:`Method.extra_modules` (learnable projections, trained
  with the student but not counted as student parameters) and :meth:`Method.search_space`;
* for a student that does not read the teacher's WordPiece ids (e.g. a word-level BiLSTM),
  :meth:`Method.student_encoder`: its own tokenisation, fitted on the training texts.

The engine owns everything else: data, the teacher and its cache, the training loop,
evaluation, checkpoint selection and the results store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer
from torch import nn

from harness.api.context import (
    AugmentContext,
    Augmenter,
    ExportedStudent,
    StudentContext,
    StudentEncoder,
    StudentKindConfig,
)
from harness.config.schema import ConfigError
from harness.data.tasks import TaskSpec

if TYPE_CHECKING:
    import optuna
    from transformers import PretrainedConfig

    from harness.config.schema import StudentConfig

SELF_ATTENTION_OUTPUTS = frozenset({"attention_scores", "queries", "keys", "values"})
"""Read from inside every self-attention layer (:func:`harness.api.capture.
capture_attention_scores`): the unnormalised (pre-softmax) scores QK^T / sqrt(d_k) plus the
padding mask, and the query, key and value vectors, (batch, heads, length, length or
head_dim), indexed by Transformer layer n at n - 1."""

TEACHER_OUTPUTS = frozenset({"logits", "hidden_states", "attentions"}) | SELF_ATTENTION_OUTPUTS
"""What a stage may ask of the teacher.  ``logits`` come from the cache; the rest are
computed on the fly by a teacher forward pass in the training loop (the embedding output
is ``hidden_states[0]``), outside autograd: they are constants of the loss, usable in its
graph."""

STUDENT_OUTPUTS = frozenset({"hidden_states", "attentions"}) | SELF_ATTENTION_OUTPUTS
"""What a stage may ask of a Transformer student's forward (:meth:`Method.forward_student`
returns them in a :class:`StudentOutputs`, with their autograd graph).  ``attentions`` (the
softmax distributions) makes the engine build the student with eager attention, the one
implementation that returns them."""

class MethodParams(BaseModel):
    """Base for a method's hyperparameters: strict, so a misspelt name is an error.

    A run id hashes the params as serialised, defaults included, except the options named
    in ``added_later`` (name -> default), which are left out while at that default: a
    plugin gives an option there when records without it exist, so they keep their run
    ids (docs/architecture.md, "What changes a run id")."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    added_later: ClassVar[dict[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _without_later_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        values = handler(self)
        for name, default in self.added_later.items():
            if name in values and values[name] == default:
                values.pop(name)
        return values


@dataclass(frozen=True)
class Stage:
    """One training stage of a method."""

    name: str
    loss_terms: tuple[str, ...]
    teacher: Literal["finetuned", "pretrained", "none"] = "finetuned"
    teacher_outputs: frozenset[str] = frozenset({"logits"})
    student_outputs: frozenset[str] = frozenset()
    """What the stage's loss terms read from the student besides its logits (see
    :data:`STUDENT_OUTPUTS`); hidden states also come whenever the teacher's are asked for."""
    evaluate: bool = True
    """Evaluate on dev during the stage and keep the best checkpoint (needs task logits)."""
    data: Literal["task", "augmented", "corpus"] = "task"
    """What the stage trains on: the task's training split; that split plus the copies made
    by the method's :meth:`Method.augmenter` (teacher logits computed and cached for them);
    or the suite's unlabeled ``corpus`` (general distillation).  ``corpus`` stages come
    first, have no task in them, and their result is cached and shared by every task and
    seed (see :meth:`Method.general_key`)."""

    def __post_init__(self) -> None:
        unknown = set(self.teacher_outputs) - TEACHER_OUTPUTS
        if unknown:
            raise ValueError(f"stage {self.name!r}: unknown teacher outputs {sorted(unknown)}")
        unknown = set(self.student_outputs) - STUDENT_OUTPUTS
        if unknown:
            raise ValueError(f"stage {self.name!r}: unknown student outputs {sorted(unknown)}")
        if self.teacher == "none" and self.teacher_outputs:
            raise ValueError(f"stage {self.name!r}: no teacher, but asks for teacher outputs")
        if self.data == "corpus" and (self.evaluate or self.teacher == "finetuned"
                                      or "logits" in self.teacher_outputs):
            raise ValueError(f"stage {self.name!r}: a corpus stage has no labels, no task "
                             "logits and no fine-tuned teacher (teacher='pretrained' or "
                             "'none', evaluate=False)")
        if self.teacher == "pretrained" and "logits" in self.teacher_outputs:
            raise ValueError(f"stage {self.name!r}: the pre-trained teacher has no task head, "
                             "so no logits: ask the fine-tuned teacher (teacher='finetuned') "
                             "for them")
        if self.data == "augmented" and self.teacher != "finetuned":
            raise ValueError(f"stage {self.name!r}: augmented copies carry no gold labels; "
                             "they need the fine-tuned teacher's outputs")

    @property
    def is_general(self) -> bool:
        return self.data == "corpus"


@dataclass(frozen=True)
class LossTerm:
    """A loss term of a method, computed by its ``loss_<name>`` method.

    The engine computes every term outside autocast, in float32: the student's outputs and
    the teacher's view reach it as float32 whatever the stage's ``mixed_precision`` (only
    the forward passes run under autocast), so a matmul inside a term runs in float32 too.
    ``autocast=True`` computes the term under the stage's autocast instead, like the
    forward pass: for a term whose cost matters more than its rounding."""

    name: str
    description: str
    autocast: bool = False


GOLD = LossTerm("gold", "cross-entropy to the gold labels (MSE to gold scores for regression)")
"""The gold-label term every method may list; :meth:`Method.loss_gold` computes it."""


@dataclass
class TeacherView:
    """Teacher outputs for one batch, as requested by the stage."""

    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    attention_scores: list[torch.Tensor] | None = None
    """(batch, heads, length, length) pre-softmax scores of Transformer layers 1..N (list
    index n - 1), padding mask included; see :class:`harness.api.capture.ScoreCapture`."""
    queries: list[torch.Tensor | None] | None = None
    keys: list[torch.Tensor | None] | None = None
    values: list[torch.Tensor | None] | None = None
    """(batch, heads, length, head_dim) vectors of Transformer layers 1..N (list index
    n - 1; None for a layer the method's :meth:`Method.teacher_layers` leaves out)."""


@dataclass
class StudentOutputs:
    """What the default :meth:`Method.forward_student` returns for a stage that declares
    ``student_outputs``: the logits, and each declared output with its autograd graph, laid
    out as in :class:`TeacherView` (self-attention outputs over Transformer layers 1..M)."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    attention_scores: list[torch.Tensor | None] | None = None
    queries: list[torch.Tensor | None] | None = None
    keys: list[torch.Tensor | None] | None = None
    values: list[torch.Tensor | None] | None = None


@dataclass(frozen=True)
class TeacherLayers:
    """Teacher layers a stage reads: hidden states (0 = embedding output, n = output of
    Transformer layer n) and self-attention outputs, ``scores`` (Transformer layers 1..N:
    their scores and, when the stage asks for them, queries, keys and values)."""

    hidden: frozenset[int] = frozenset()
    scores: frozenset[int] = frozenset()

    @property
    def depth(self) -> int:
        """The deepest Transformer layer needed (0: the embeddings only)."""
        return max((*self.hidden, *self.scores), default=0)

    def check(self, num_layers: int) -> TeacherLayers:
        bad = ([f"hidden {n}" for n in sorted(self.hidden) if not 0 <= n <= num_layers]
               + [f"scores {n}" for n in sorted(self.scores) if not 1 <= n <= num_layers])
        if bad:
            raise ValueError(f"teacher layers {bad} out of range for a {num_layers}-layer "
                             "teacher (hidden states 0..N, attention scores 1..N)")
        return self

    def describe(self) -> dict[str, list[int]]:
        return {"hidden": sorted(self.hidden), "scores": sorted(self.scores)}


def stage_layers(method: Method, stage: Stage, num_teacher_layers: int,
                 student: nn.Module) -> TeacherLayers | None:
    """What of the teacher ``stage`` reads, as the method declares it and limited to the
    outputs the stage asks for; None when the method does not say (all layers)."""
    declared = method.teacher_layers(stage, num_teacher_layers, student)
    if declared is None:
        return None
    outputs = stage.teacher_outputs
    return TeacherLayers(
        hidden=declared.hidden if "hidden_states" in outputs else frozenset(),
        scores=declared.scores if outputs & SELF_ATTENTION_OUTPUTS else frozenset(),
    ).check(num_teacher_layers)


@dataclass
class StepInputs:
    """Everything a loss term may use for one batch."""

    batch: dict[str, torch.Tensor]
    student: Any
    """The student's forward output (a transformers ModelOutput for Transformer students)."""
    teacher: TeacherView
    task: TaskSpec
    stage: Stage
    extra: nn.ModuleDict
    cache: dict[str, Any] = field(default_factory=dict)
    """Scratch space shared by the terms of one step (e.g. a softmax computed once)."""
    stage_autocast: Callable[[], AbstractContextManager[Any]] = nullcontext
    """The stage's autocast, entered around the terms that declare ``autocast=True``
    (:class:`LossTerm`); the engine sets it."""


class Method:
    """Base class of a distillation method plugin."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Params: ClassVar[type[MethodParams]] = MethodParams
    loss_terms: ClassVar[tuple[LossTerm, ...]] = ()
    student_kinds: ClassVar[tuple[str, ...]] = ("bert",)
    """The student shape kinds (``kind`` in a suite's ``students``) the method can build."""
    student_shapes: ClassVar[dict[str, type[StudentKindConfig]]] = {}
    """Student kinds this plugin defines, each with the schema of its shapes (``bert`` is
    the core's); the registry makes them known to every suite."""
    stage_names: ClassVar[tuple[str, ...] | None] = None
    """Every stage the method can have, when its stages depend on its parameters: a
    recipe's budget for one of these that a configuration leaves out is ignored (a variant
    inherits its base's budgets); any other name is an error.  None: the stages of
    :meth:`stages` are the only valid names."""

    def __init__(self, params: MethodParams, weights: dict[str, float]) -> None:
        self.params = params
        self.weights = weights

    # -- declared by plugins -------------------------------------------------------------
    def stages(self, task: TaskSpec) -> list[Stage]:
        raise NotImplementedError

    def default_weights(self) -> dict[str, float]:
        """Weights of the loss terms before recipe overrides; may depend on ``params``."""
        return {term.name: 1.0 for term in self.loss_terms}

    def build_student(self, context: StudentContext) -> nn.Module:
        """The student, ready to train.  A dict set as ``student.init_summary`` (e.g. word
        vector coverage) goes into the run record."""
        from harness.api.students import build_encoder_student

        return build_encoder_student(context)

    def extra_modules(self, context: StudentContext) -> nn.ModuleDict:
        """Learnable modules trained with the student (projections); not part of it."""
        return nn.ModuleDict()

    def forward_student(self, student: nn.Module, batch: dict[str, torch.Tensor],
                        stage: Stage) -> Any:
        """Run the student on ``batch`` in ``stage``; what it returns is ``inputs.student``
        in the loss terms.

        ``student`` is the module :meth:`build_student` returned: attributes read the model
        itself (its config, embeddings), and calling it runs the training forward (through
        the data-parallel wrapper when there is one).  ``batch`` holds ``input_ids``,
        ``attention_mask``, ``token_type_ids``, ``labels`` and ``row`` (plus
        ``has_gold`` on augmented data and the encoder's own fields, see
        :class:`StudentEncoder`).  The default suits transformers sequence classifiers: the
        model output (``logits``; ``hidden_states`` when the stage reads the teacher's or
        declares the student's), or, when the stage declares ``student_outputs``, a
        :class:`StudentOutputs` with each of them.  Override it for another student kind or
        another forward."""
        outputs = stage.student_outputs
        hidden = "hidden_states" in stage.teacher_outputs or "hidden_states" in outputs
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                  "token_type_ids": batch.get("token_type_ids"),
                  "output_hidden_states": hidden}
        if not outputs:
            return student(**kwargs)
        if "attentions" in outputs:
            kwargs["output_attentions"] = True
        projections = outputs & {"queries", "keys", "values"}
        if not outputs & SELF_ATTENTION_OUTPUTS:
            out = student(**kwargs)
            return StudentOutputs(out.logits, out.hidden_states, out.attentions)
        from harness.api.capture import capture_attention_scores

        with capture_attention_scores(student, record=projections) as captured:
            out = student(**kwargs)
        return StudentOutputs(
            out.logits, out.hidden_states if hidden else None,
            out.attentions if "attentions" in outputs else None,
            **{name: captured.by_layer("scores" if name == "attention_scores" else name)
               for name in outputs & SELF_ATTENTION_OUTPUTS})

    def architecture_problem(self, teacher_config: PretrainedConfig) -> str | None:
        """Why the method cannot distil a teacher of this architecture (its student being of
        the same architecture), beyond what the core checks itself (stages that read
        attention scores, queries, keys or values from an architecture whose self-attention
        cannot be captured, :func:`harness.experiments.compatibility.method_architecture_problem`);
        None (the default): it can.  Asked when a run is resolved, before anything trains."""
        return None

    def student_problem(self, shape: StudentConfig, teacher_config: PretrainedConfig
                        ) -> str | None:
        """Why the method cannot build its student from the suite's BERT-family ``shape``
        (``teacher`` sizes resolved) for this teacher: a layer mapping that does not fit
        the depths, copied layers of another width, too few heads for a head-by-head term.
        None (the default): it can.  Asked for every cell before the first one trains,
        from the teacher's config alone, so a bad recipe stops before the teacher is
        fine-tuned; a plugin's :meth:`build_student` should refuse the same (see
        :meth:`refuse_student`)."""
        return None

    def refuse_student(self, shape: StudentConfig, teacher_config: PretrainedConfig) -> None:
        """Raise ConfigError with :meth:`student_problem`'s reason, if it has one (``shape``'s
        ``teacher`` sizes resolved first)."""
        from harness.api.students import resolve_teacher_sizes

        shape = resolve_teacher_sizes(shape, teacher_config)
        if (problem := self.student_problem(shape, teacher_config)) is not None:
            raise ConfigError(f"methods.{self.name}: {problem}")

    def task_problem(self, task: TaskSpec) -> str | None:
        """Why the method does not apply to ``task`` (a loss over classes on a regression
        task); None (the default): it does.  Asked for every cell before anything is read
        or trained: ``harness run`` and ``harness grid`` leave such a cell out, name it
        ``n/a``, and record nothing for it."""
        return None

    def inactive_terms(self, task: TaskSpec) -> frozenset[str]:
        """Loss terms that compute nothing on ``task`` (a term over non-target classes on a
        two-class task): they are not computed there, and left out of the run's
        ``loss_weights`` and of each stage's ``terms`` in its record.  Empty (the default):
        every term applies."""
        return frozenset()

    def missing_assets(self) -> str | None:
        """What the method needs that this machine lacks (a package, a file), with how to
        get it; None (the default): nothing.  Asked for every cell before the first one
        trains, so a missing asset stops a run at once, not when the stage that reads it
        begins, after the general distillation."""
        return None

    def save_student(self, student: nn.Module, encoder: StudentEncoder | None,
                     task: TaskSpec, folder: Path) -> bool:
        """Write a trained student that is not a Transformers model into ``folder`` (weights
        as safetensors, its configuration and its tokenisation) so that
        :meth:`load_student` rebuilds it from the folder alone, for ``harness export``.
        Returns False (the default) when the method has no such format: the run then keeps
        the student's state dict only, and exporting it is refused. Transformers students
        are saved by the harness itself and never reach this hook."""
        return False

    @classmethod
    def load_student(cls, folder: Path) -> ExportedStudent:
        """The student :meth:`save_student` wrote into ``folder``, ready to predict."""
        raise NotImplementedError(f"{cls.name} does not export its students")

    def search_space(self, trial: optuna.Trial) -> dict[str, Any]:
        """Optuna search space as dotted recipe overrides, e.g. ``{"params.alpha": 0.5}``."""
        return {}

    def teacher_layers(self, stage: Stage, num_teacher_layers: int,
                       student: nn.Module) -> TeacherLayers | None:
        """The teacher layers ``stage``'s loss terms read: hidden states (0 = embeddings,
        1..N) and attention scores (1..N).  None (the default): all of them.  Declaring
        them lets the engine stop the live teacher forward after the deepest one, capture
        only those scores and cache only those on disk; the stage's view then holds None
        for the layers left out (same tuple and list lengths, N + 1 and N)."""
        return None

    def prepare_batch(self, batch: dict[str, torch.Tensor], stage: Stage,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Rewrite a training batch before the teacher and the student see it (e.g. masking
        for a masked-LM objective); ``generator`` is seeded per stage, so runs repeat."""
        return batch

    def student_encoder(self, context: StudentContext,
                        train_texts: Sequence[tuple[str, ...]]) -> StudentEncoder | None:
        """The student's own tokenisation, fitted on the task's training texts (None: the
        student reads the teacher's WordPiece ids)."""
        return None

    def augmenter(self, context: AugmentContext) -> Augmenter | None:
        """The augmenter behind ``data="augmented"`` stages (None: no augmentation)."""
        return None

    def stage_weights(self, stage: Stage) -> dict[str, float]:
        """Loss weights in ``stage``; a method may give a stage its own (e.g. general
        distillation keeps the full objective while task-stage ablations switch terms off)."""
        return self.weights

    def run_key(self) -> dict[str, Any]:
        """What a run's result depends on besides its parameters, loss weights, stages,
        student, teacher and data: the version of code of the plugin's own that changes what
        one configuration computes (an augmenter that now writes other copies), and the
        assets only the method reads (word vectors for augmentation candidates).  A
        non-empty key joins the run id, so the store does not take a record of the older
        code or other assets for a run of these.  Empty, the default and every plugin's
        first version, it leaves run ids as they are."""
        return {}

    def reads_corpus(self) -> bool:
        """Whether a run's result depends on the suite's unlabeled corpus outside corpus
        stages (an augmenter that fits a masked-LM head on :attr:`AugmentContext.corpus`).
        True puts the corpus's sentences in the run id, as corpus stages put the corpus in
        their general checkpoint's key; False (the default) leaves run ids as they are."""
        return False

    def general_key(self) -> dict[str, Any]:
        """What the result of the ``corpus`` stages depends on, besides the student shape,
        teacher, corpus and stage budgets: it keys their cache, so leave out whatever only
        task stages read, or every ablation would redo general distillation."""
        return {"params": self.params.model_dump(), "weights": self.weights}

    def general_made_from(self) -> list[tuple[str, str]]:
        """The cache entries (kind, key) the ``corpus`` stages read besides the checkpoint
        and the corpus (a masked-LM head fitted for the teacher), asked once they have
        trained: the general checkpoint records them, and is made again once one of them
        is rebuilt with other contents.  Empty, the default: they read none."""
        return []

    def loss_gold(self, inputs: StepInputs) -> torch.Tensor:
        """The :data:`GOLD` term: cross-entropy to the gold labels, or MSE to the gold
        scores of a regression task, over the rows that have one (augmented copies do not)."""
        from harness.api.losses import gold_loss

        return gold_loss(inputs.student.logits, inputs.batch["labels"],
                         inputs.task.is_regression, inputs.batch.get("has_gold"))

    # -- used by the engine --------------------------------------------------------------
    def compute_losses(self, inputs: StepInputs) -> dict[str, torch.Tensor]:
        """Unweighted values of the stage's active terms (:meth:`active_terms`), each in
        float32 outside autocast unless its :class:`LossTerm` declares ``autocast``."""
        declared = {term.name: term for term in self.loss_terms}
        values = {}
        for term in self.active_terms(inputs.stage, inputs.task):
            under_autocast = term in declared and declared[term].autocast
            with inputs.stage_autocast() if under_autocast else nullcontext():
                values[term] = getattr(self, f"loss_{term}")(inputs)
        return values

    def active_terms(self, stage: Stage, task: TaskSpec) -> dict[str, float]:
        """The terms ``stage`` computes on ``task``, with their weights: those it names
        whose weight is not 0 and that apply to the task (:meth:`inactive_terms`)."""
        weights = self.stage_weights(stage)
        inactive = self.inactive_terms(task)
        return {term: weights[term] for term in stage.loss_terms
                if weights.get(term, 0.0) != 0.0 and term not in inactive}

    def total_loss(self, values: dict[str, torch.Tensor], stage: Stage | None = None
                   ) -> torch.Tensor:
        weights = self.stage_weights(stage) if stage is not None else self.weights
        return sum(weights[name] * value for name, value in values.items())  # type: ignore[return-value]

"""DistilBERT (Sanh et al., arXiv 1910.01108).

Student: the teacher's architecture with fewer layers (half, by default) and the same
hidden size, initialised from teacher layers chosen by :func:`alternate_layers` (the
released 12 -> 6 recipe: teacher layers 0, 2, 4, 7, 9, 11), or from an explicit list, or
randomly (the paper's "random initialisation" ablation).  Embeddings, the pooler and the
masked-LM head come from the teacher too when the student starts from it.

Stages:

1. ``general`` (data ``corpus``): the pre-trained teacher on the suite's unlabeled corpus,
   dynamic masking (``mask_prob`` of the real tokens; 80% [MASK], 10% a random token, 10%
   kept), both models seeing the masked input, and
   L = alpha_ce L_ce + alpha_mlm L_mlm + alpha_cos L_cos (released recipe 5, 2, 1, T = 2):

   * ``ce``: T^2 KL(softmax(z_T/T) || softmax(z_S/T)) over the vocabulary at the masked
     positions (mean over masked positions);
   * ``mlm``: the student's own masked-LM cross-entropy to the original tokens;
   * ``cos``: 1 - cos(h_S, h_T) between the last hidden states, mean over real tokens.

   The result is cached and shared by every task and seed (:meth:`DistilBERT.general_key`).
2. On each task, the paper's protocol: ``finetune`` on gold labels.  As a variant
   (``task_distillation: true``), ``task``: (1 - task_alpha) CE(gold) + task_alpha T^2
   KL(teacher || student) over the task labels (``ce`` again; MSE to the teacher's
   prediction for regression), from the fine-tuned teacher's cached logits.

Vocabulary distributions need a masked-LM head.  The teacher's own head is used when the
checkpoint has one (BERT); the offline MiniLM has none, so it gets the head fitted tied to
its embeddings (:func:`harness.assets.mlm.load_masked_lm`, the one TinyBERT's augmentation uses;
its held-out recall is in the cache summary and the log).  ``vocabulary_terms: false``
drops ``ce`` and ``mlm`` instead (the general stage then distils with ``cos`` alone).

The student is of the teacher's architecture (:mod:`harness.api.architectures`): a BERT
teacher gives a BERT student, a DistilBERT teacher a DistilBERT one, and so on.

Where this differs from the released code: a BERT student keeps BERT's token-type
embeddings (theirs drops them; GLUE pairs need them here); masking is uniform over real
tokens (theirs smooths the masking probability by token frequency, ``mlm_smoothing``);
the corpus and budget are the suite's, not BookCorpus + Wikipedia for 90 GPU-hours.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from harness.api import (
    ConfigError,
    LossTerm,
    Method,
    MethodParams,
    Stage,
    StepInputs,
    StudentConfig,
    StudentContext,
    TaskSpec,
    build_encoder_student,
    dimensions,
    register_method,
    soft_kl,
    soft_target_loss,
    teacher_fit_problem,
)
from harness.assets.mlm import MLMHeadConfig, load_masked_lm

if TYPE_CHECKING:
    import optuna
    from transformers import PretrainedConfig

GENERAL_TERMS = ("ce", "mlm", "cos")
IGNORE = -100


def alternate_layers(num_teacher: int, num_student: int) -> list[int]:
    """Teacher layers (0-based) for a student of ``num_student`` layers: evenly spread from
    the first to the last, rounded half up, so 12 -> 6 gives DistilBERT's 0, 2, 4, 7, 9, 11
    ("one of every two") and 6 -> 3 gives 0, 3, 5.  A 1-layer student takes layer 0."""
    if not 0 < num_student <= num_teacher:
        raise ValueError(f"cannot take {num_student} layers from a {num_teacher}-layer teacher")
    if num_student == 1:
        return [0]
    step = (num_teacher - 1) / (num_student - 1)
    return [int(index * step + 0.5) for index in range(num_student)]


def mask_tokens(input_ids: torch.Tensor, maskable: torch.Tensor, mask_token_id: int,
                vocab_size: int, mask_prob: float, generator: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's dynamic masking: each ``maskable`` position is picked with ``mask_prob``; a
    picked token becomes [MASK] (80%), a uniformly random token (10%) or stays (10%).

    Returns the masked ids and the labels (the original id at picked positions, -100
    elsewhere).  At least one position per batch is picked when any is maskable, so the
    vocabulary terms are always defined.
    """
    draws = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    picked = (draws < mask_prob) & maskable
    if not picked.any() and maskable.any():
        first = maskable.flatten().nonzero()[0]
        picked.view(-1)[first] = True
    labels = torch.where(picked, input_ids, torch.full_like(input_ids, IGNORE))
    action = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator,
                               device=input_ids.device)
    masked = input_ids.clone()
    masked[picked & (action < 0.8)] = mask_token_id
    replace = picked & (action >= 0.8) & (action < 0.9)
    masked[replace] = random_ids[replace]
    return masked, labels


def cosine_hidden_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                       attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens of 1 - cos(h_S, h_T) (``nn.CosineEmbeddingLoss``, target 1)."""
    real = attention_mask.bool()
    return (1.0 - F.cosine_similarity(student_hidden[real].float(),
                                      teacher_hidden[real].float(), dim=-1)).mean()


class StudentMLMHead(nn.Module):
    """BERT's MLM transform (dense, GELU, LayerNorm) and output bias; the decoder is the
    student's word-embedding matrix, passed in at each call (tied, not copied)."""

    def __init__(self, hidden_size: int, vocab_size: int, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        transformed = self.layer_norm(F.gelu(self.dense(hidden)))
        return F.linear(transformed, word_embeddings) + self.bias


@dataclass
class DistilBERTStudentOutput:
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None
    word_embeddings: torch.Tensor
    """The student's input embedding matrix (its MLM decoder)."""


@dataclass(frozen=True)
class _Vocabulary:
    size: int
    mask_token_id: int
    special_ids: tuple[int, ...]


@register_method
class DistilBERT(Method):
    name = "distilbert"
    description = ("DistilBERT: a half-depth student built from teacher layers, distilled "
                   "on unlabeled text (soft-target CE over the vocabulary, MLM, cosine of "
                   "hidden states), then fine-tuned on each task")

    class Params(MethodParams):
        temperature: float = Field(2.0, gt=0, description="T of the soft-target terms")
        init: Literal["teacher", "random"] | list[Annotated[int, Field(ge=0)]] = Field(
            "teacher", description="teacher: layers from alternate_layers(N, M); an explicit "
            "0-based list of teacher layers; random: no teacher weights (ablation)")
        mask_prob: float = Field(0.15, gt=0, lt=1)
        vocabulary_terms: bool = Field(
            True, description="False: drop the general stage's ce and mlm (no masked-LM "
            "head for the teacher); the task stage's ce on the logits stays")
        mlm_head: MLMHeadConfig = Field(
            default_factory=MLMHeadConfig, description="how to fit the teacher's masked-LM "
            "head when its checkpoint has none")
        general_distillation: bool = Field(
            True, description="False: fine-tune the initialised student directly")
        task_distillation: bool = Field(
            False, description="on each task, distil the fine-tuned teacher's logits "
            "instead of fine-tuning on gold labels only")
        task_alpha: float = Field(0.5, ge=0, le=1, description="weight of ce in task "
                                  "distillation (gold gets 1 - task_alpha)")

    stage_names = ("general", "finetune", "task")
    loss_terms = (
        LossTerm("ce", "T^2 KL to the teacher's soft targets: over the vocabulary at masked "
                 "positions (general), over the task labels (task distillation)"),
        LossTerm("mlm", "the student's masked-LM cross-entropy to the original tokens"),
        LossTerm("cos", "1 - cosine between student and teacher last hidden states, mean "
                 "over real tokens"),
        LossTerm("gold", "cross-entropy (MSE for regression) to the task's gold labels"),
    )

    def __init__(self, params: MethodParams, weights: dict[str, float]) -> None:
        super().__init__(params, weights)
        self._vocabulary: _Vocabulary | None = None
        self._assets = None
        self._teacher_head: nn.Module | None = None
        self._teacher_head_sources: list[tuple[str, str]] = []

    # -- declaration ---------------------------------------------------------------------
    def default_weights(self) -> dict[str, float]:
        return {"ce": 5.0, "mlm": 2.0, "cos": 1.0, "gold": 1.0}

    def general_weights(self) -> dict[str, float]:
        """The general stage's weights: ``vocabulary_terms: false`` drops its ce and mlm
        (they need the teacher's masked-LM head), not the task stage's ce on the logits."""
        vocabulary = self.params.vocabulary_terms
        return {term: self.weights[term] if vocabulary or term == "cos" else 0.0
                for term in GENERAL_TERMS}

    @cached_property
    def _general(self) -> dict[str, float]:
        """:meth:`general_weights`, once (params and weights are fixed after construction)."""
        return self.general_weights()

    @property
    def _vocabulary_terms_on(self) -> bool:
        return bool(self._general["ce"] or self._general["mlm"])

    def stage_weights(self, stage: Stage) -> dict[str, float]:
        if stage.is_general:
            return self.general_weights()
        if stage.name == "task":
            alpha = self.params.task_alpha
            return {"ce": alpha if self.weights["ce"] else 0.0,
                    "gold": (1.0 - alpha) * self.weights["gold"]}
        return {"gold": self.weights["gold"]}

    def general_key(self) -> dict[str, Any]:
        params = self.params
        return {"init": params.init, "temperature": params.temperature,
                "mask_prob": params.mask_prob, "mlm_head": params.mlm_head.model_dump(),
                "weights": self.general_weights()}

    def stages(self, task: TaskSpec) -> list[Stage]:
        stages = []
        if self.params.general_distillation:
            if not any(self.general_weights().values()):
                raise ConfigError("every general-distillation term (ce, mlm, cos) is off; "
                                  "set general_distillation: false instead")
            stages.append(Stage("general", GENERAL_TERMS, teacher="pretrained",
                                teacher_outputs=frozenset({"hidden_states"}), evaluate=False,
                                data="corpus"))
        if not self.weights["gold"] and not (self.params.task_distillation
                                             and self.weights["ce"]):
            raise ConfigError("the gold term trains the task head when there is no task "
                              "distillation; it cannot be disabled")
        if self.params.task_distillation:
            stages.append(Stage("task", ("ce", "gold"), teacher="finetuned",
                                teacher_outputs=frozenset({"logits"})))
        else:
            stages.append(Stage("finetune", ("gold",), teacher="none",
                                teacher_outputs=frozenset()))
        return stages

    def init_layers(self, num_teacher: int, num_student: int) -> list[int] | None:
        """The teacher layers the student starts from (None: random initialisation);
        ValueError when ``params.init`` does not fit the depths."""
        init = self.params.init
        if init == "random":
            return None
        if init == "teacher":
            try:
                return alternate_layers(num_teacher, num_student)
            except ValueError as error:
                raise ValueError(f"params.init: {error}") from None
        if len(init) != num_student or any(layer >= num_teacher for layer in init):
            raise ValueError(f"params.init: {init} must list {num_student} teacher layers in "
                             f"0..{num_teacher - 1}")
        return list(init)

    def initialised_shape(self, shape: StudentConfig, num_teacher: int) -> StudentConfig:
        """The suite's shape as this method builds it: ``params.init`` decides its layers
        and embeddings (copies of the teacher's, or random), whatever the shape says."""
        layers = self.init_layers(num_teacher, shape.num_layers)
        if layers is None:
            return shape.model_copy(update={"init": "random", "teacher_layers": None,
                                            "embedding_init": "random"})
        return shape.model_copy(update={"init": "teacher_layers", "teacher_layers": layers,
                                        "embedding_init": "teacher"})

    def student_problem(self, shape: StudentConfig, teacher_config: PretrainedConfig
                        ) -> str | None:
        """The student keeps the teacher's width (its embeddings, and with ``init`` other
        than random its layers, are trained as or copied from the teacher's)."""
        if shape.hidden_size != teacher_config.hidden_size:
            return (f"the student keeps the teacher's hidden size "
                    f"({teacher_config.hidden_size}), not {shape.hidden_size}")
        teacher = dimensions(teacher_config)
        try:
            initialised = self.initialised_shape(shape, teacher.layers)
        except ValueError as error:
            return str(error)
        return teacher_fit_problem(initialised, teacher)

    def build_student(self, context: StudentContext) -> nn.Module:
        teacher = context.teacher_config
        self.refuse_student(context.shape, teacher)
        shape = self.initialised_shape(context.shape, dimensions(teacher).layers)
        if context.assets is not None:
            tokenizer = context.assets.tokenizer
            self._vocabulary = _Vocabulary(teacher.vocab_size, tokenizer.mask_token_id,
                                           tuple(tokenizer.all_special_ids))
            self._assets = context.assets
        return build_encoder_student(replace(context, shape=shape, teacher_config=teacher))

    def extra_modules(self, context: StudentContext) -> nn.ModuleDict:
        """The student's MLM head (general distillation), started from the teacher's head
        when the student starts from teacher weights."""
        modules = nn.ModuleDict()
        if not (self.params.general_distillation and self._vocabulary_terms_on):
            return modules
        teacher = context.teacher_config
        head = StudentMLMHead(context.shape.hidden_size, teacher.vocab_size,
                              getattr(teacher, "layer_norm_eps", 1e-12))
        if self.params.init != "random":
            teacher_head = self._load_teacher_head(context.assets)
            own = _head_state(teacher_head)
            if own is None:  # a student from teacher weights with a random head: refuse
                raise ValueError(f"distilbert: the teacher's masked-LM head "
                                 f"({type(teacher_head).__name__}) has no transform this "
                                 "method can start its student's head from; use "
                                 "params.init: random or another teacher")
            head.load_state_dict(own)
        modules["mlm_head"] = head
        return modules

    def forward_student(self, student: nn.Module, batch: dict[str, torch.Tensor],
                        stage: Stage) -> DistilBERTStudentOutput:
        model = student
        output = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         token_type_ids=batch.get("token_type_ids"),
                         output_hidden_states=stage.is_general)
        return DistilBERTStudentOutput(
            logits=output.logits, hidden_states=output.hidden_states,
            word_embeddings=model.get_input_embeddings().weight)

    def prepare_batch(self, batch: dict[str, torch.Tensor], stage: Stage,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Dynamic masking for the general stage (a fresh mask every time a sentence is
        seen); task batches pass through."""
        if not stage.is_general or not self._vocabulary_terms_on:
            return batch
        vocabulary = self._vocabulary
        if vocabulary is None:
            raise RuntimeError("distilbert: build_student must run (with the teacher's "
                               "tokenizer) before general distillation")
        input_ids = batch["input_ids"]
        special = torch.tensor(vocabulary.special_ids, device=input_ids.device)
        maskable = batch["attention_mask"].bool() & ~torch.isin(input_ids, special)
        masked, labels = mask_tokens(input_ids, maskable, vocabulary.mask_token_id,
                                     vocabulary.size, self.params.mask_prob, generator)
        return {**batch, "input_ids": masked, "mlm_labels": labels}

    def search_space(self, trial: optuna.Trial) -> dict[str, Any]:
        """The lr of the task stage this configuration runs (``task`` with task
        distillation, else ``finetune``): a key naming the other would train every trial
        alike."""
        stage = "task" if self.params.task_distillation else "finetune"
        return {f"stages.{stage}.lr": trial.suggest_float("lr", 1e-5, 3e-4, log=True)}

    # -- teacher head --------------------------------------------------------------------
    def _load_teacher_head(self, assets) -> nn.Module:
        if self._teacher_head is None:
            if assets is None:
                raise RuntimeError("distilbert: the teacher's masked-LM head needs the "
                                   "checkpoint and corpus (StudentContext.assets)")
            masked_lm = load_masked_lm(assets.checkpoint, assets.corpus(), assets.cache,
                                       self.params.mlm_head, assets.log, assets.tokenizer,
                                       device="cpu")
            self._teacher_head = masked_lm.head.requires_grad_(False).eval()
            self._teacher_head_sources = masked_lm.made_from()
        return self._teacher_head

    def general_made_from(self) -> list[tuple[str, str]]:
        """The teacher's masked-LM head where it is a fitted one: the general stage
        starts the student's head from it and distils its vocabulary distributions."""
        return list(self._teacher_head_sources)

    def _masked_rows(self, inputs: StepInputs) -> tuple[torch.Tensor, ...]:
        """(student vocabulary logits, teacher vocabulary logits, labels) at the masked
        positions, computed once per step."""
        if "masked" not in inputs.cache:
            labels = inputs.batch["mlm_labels"]
            picked = labels != IGNORE
            student_hidden = inputs.student.hidden_states[-1][picked]
            head = inputs.extra["mlm_head"]
            student_logits = head(student_hidden, inputs.student.word_embeddings)
            teacher_logits = None
            if self._general["ce"]:
                teacher_head = self._load_teacher_head(self._assets)
                teacher_head.to(student_hidden.device)
                with torch.inference_mode():
                    teacher_logits = teacher_head(
                        inputs.teacher.hidden_states[-1][picked]).float()
                teacher_logits = teacher_logits.clone()  # usable in autograd
            inputs.cache["masked"] = (student_logits, teacher_logits, labels[picked])
        return inputs.cache["masked"]

    # -- loss terms ----------------------------------------------------------------------
    def loss_ce(self, inputs: StepInputs) -> torch.Tensor:
        if inputs.stage.is_general:
            student_logits, teacher_logits, _ = self._masked_rows(inputs)
            return soft_kl(student_logits, teacher_logits, self.params.temperature)
        return soft_target_loss(inputs.student.logits, inputs.teacher.logits,
                                self.params.temperature, inputs.task.is_regression)

    def loss_mlm(self, inputs: StepInputs) -> torch.Tensor:
        student_logits, _, labels = self._masked_rows(inputs)
        return F.cross_entropy(student_logits.float(), labels)

    def loss_cos(self, inputs: StepInputs) -> torch.Tensor:
        return cosine_hidden_loss(inputs.student.hidden_states[-1],
                                  inputs.teacher.hidden_states[-1],
                                  inputs.batch["attention_mask"])


def _head_state(head: nn.Module) -> dict[str, torch.Tensor] | None:
    """A teacher MLM head's transform and bias in :class:`StudentMLMHead`'s names (a fitted
    :class:`~harness.assets.mlm.TiedMLMHead`, RoBERTa's ``lm_head``, BERT's ``cls`` head or
    DistilBERT's vocabulary layers); None for other heads."""
    state = head.state_dict()
    if "dense.weight" in state:  # TiedMLMHead, RoBERTa's lm_head (same names)
        names = {"dense.weight": "dense.weight", "dense.bias": "dense.bias",
                 "layer_norm.weight": "layer_norm.weight", "layer_norm.bias": "layer_norm.bias",
                 "bias": "bias"}
    elif "predictions.transform.dense.weight" in state:  # BertOnlyMLMHead
        names = {"dense.weight": "predictions.transform.dense.weight",
                 "dense.bias": "predictions.transform.dense.bias",
                 "layer_norm.weight": "predictions.transform.LayerNorm.weight",
                 "layer_norm.bias": "predictions.transform.LayerNorm.bias",
                 "bias": "predictions.bias"}
    elif "transform.weight" in state and "projector.bias" in state:  # DistilBERT's layers
        names = {"dense.weight": "transform.weight", "dense.bias": "transform.bias",
                 "layer_norm.weight": "layer_norm.weight", "layer_norm.bias": "layer_norm.bias",
                 "bias": "projector.bias"}
    else:
        return None
    return {ours: state[theirs].detach().clone() for ours, theirs in names.items()}

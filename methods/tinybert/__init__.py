"""TinyBERT (Jiao et al., arXiv 1909.10351, Findings of EMNLP 2020).

Layer m of the student (0 = embeddings, 1..M = Transformer layers, M+1 = prediction layer)
learns from teacher layer g(m) (:func:`harness.api.layer_mapping.layer_map`, g(0) = 0,
g(M+1) = N+1), weighted by lambda_m:

* ``embedding``: lambda_0 MSE(E_S W_e, E_T);
* ``hidden``: sum_m lambda_m MSE(H_S,m W_h, H_T,g(m)), m = 1..M;
* ``attention``: sum_m lambda_m (1/h) sum_i MSE(A_S,m,i, A_T,g(m),i) on unnormalised
  attention scores (needs as many student heads as teacher heads);
* ``prediction``: lambda_{M+1} soft cross-entropy at temperature t to the teacher's logits,
  or, for regression, the MSE to the teacher's prediction (never the gold score).

The paper's two-stage procedure:

1. ``general`` (data ``corpus``): the pre-trained teacher on the suite's unlabeled corpus,
   embedding + attention + hidden losses; it produces the "general TinyBERT", cached and
   shared by every task, seed and objective ablation (:meth:`TinyBERT.general_key`).
2. Task distillation from the fine-tuned teacher on the training set plus its augmented
   copies (:mod:`methods.tinybert.augmentation`): ``intermediate`` (embedding, attention, hidden;
   live teacher; no dev evaluation), then ``prediction`` (cached teacher logits, best
   checkpoint picked on dev).  Each stage has its own budget in the recipe.

Ablations are switches: ``disabled_losses`` (w/o Embd / Attn / Hidn / Pred; w/o Trm is
attention + hidden; these change task distillation only), ``general_distillation: false``
(w/o GD: the suite's student initialisation), ``task_distillation: false`` (w/o TD: the
general TinyBERT fine-tuned on gold labels), ``augment: false`` (w/o DA; ``augmented_stages``
keeps it in one task stage only) and ``mapping``.
Without the prediction term ("w/o Pred") the classifier is trained on gold labels of the
plain task data (the ``gold`` term), since something must train it.

Where this differs from the authors' code: token and attention losses average over real
tokens only (theirs over every position, padded attention entries zeroed); the soft
cross-entropy sums over classes (theirs also averages over them, a 1/C rescaling); STS-B
fits the teacher's prediction (theirs the gold score, their issue #128); W_e and W_h are
separate unless ``shared_projection`` (theirs share one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from harness.api import (
    AugmentContext,
    ConfigError,
    LossTerm,
    Method,
    MethodParams,
    Stage,
    StepInputs,
    StudentConfig,
    StudentContext,
    TaskSpec,
    TeacherLayers,
    attention_score_loss,
    capture_attention_scores,
    embedding_loss,
    hidden_loss,
    layer_map,
    layer_weights,
    register_method,
    soft_cross_entropy,
    teacher_regression_loss,
)
from harness.assets.glove import glove_problem, vectors_run_identity
from methods.tinybert.augmentation import AugmentParams, ContextualAugmenter, build_augmenter

if TYPE_CHECKING:
    import optuna
    from transformers import PretrainedConfig

INTERMEDIATE_TERMS = ("embedding", "attention", "hidden")
PAPER_AUGMENTED_STAGES = ["intermediate", "prediction"]
"""The task stages that read the augmented set in the paper (the default)."""
Mapping = Literal["uniform", "top", "bottom"] | list[Annotated[int, Field(ge=1)]]


@dataclass
class TinyBERTStudentOutput:
    """What the loss terms read from the student for one batch."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None
    """Embedding output, then the output of each Transformer layer (intermediate stage)."""
    attention_scores: list[torch.Tensor] | None
    """Pre-softmax scores of Transformer layers 1..M (intermediate stage, attention on)."""
    num_layers: int


@register_method
class TinyBERT(Method):
    name = "tinybert"
    description = ("TinyBERT: general distillation on unlabeled text, then task distillation "
                   "(embedding, attention-score and hidden-state losses, then the prediction "
                   "layer) on augmented task data")

    class Params(MethodParams):
        added_later: ClassVar[dict[str, Any]] = {"augmented_stages": PAPER_AUGMENTED_STAGES}

        temperature: float = Field(1.0, gt=0, description="t of the prediction-layer loss")
        mapping: Mapping = Field(
            "uniform", description="layer mapping g: a strategy, or the teacher layer (1..N) "
            "of each student Transformer layer")
        general_mapping: Mapping | None = Field(
            None, description="mapping of general distillation; default: the same as "
            "mapping (set it to share one general checkpoint across mapping ablations)")
        layer_weights: list[Annotated[float, Field(ge=0)]] | None = Field(
            None, description="lambda_m for m = 0..M+1 (embeddings, Transformer layers, "
            "prediction layer); default all 1")
        shared_projection: bool = Field(
            False, description="one projection W for the embeddings and every layer (the "
            "authors' code) instead of separate W_e and W_h per mapped layer (the paper)")
        general_distillation: bool = Field(
            True, description="start from the general TinyBERT (False: from the suite's "
            "student initialisation: the 'w/o GD' ablation)")
        task_distillation: bool = Field(
            True, description="False: fine-tune the general TinyBERT on gold labels "
            "(the 'w/o TD' ablation)")
        augment: bool = Field(True, description="task distillation on the training set plus "
                              "augmented copies (False: the 'w/o DA' ablation)")
        augmented_stages: list[Literal["intermediate", "prediction"]] = Field(
            default_factory=lambda: list(PAPER_AUGMENTED_STAGES), min_length=1,
            description="the task stages that read the augmented set (as the paper); the "
            "others read the plain training set. ['intermediate'] asks whether augmentation "
            "helps by what the body fits or by what the head is trained on")
        augmentation: AugmentParams = Field(default_factory=AugmentParams)

    stage_names = ("general", "intermediate", "prediction", "finetune")
    loss_terms = (
        LossTerm("embedding", "lambda_0 MSE(E_S W_e, E_T) over real tokens"),
        LossTerm("attention", "sum over mapped layers of lambda_m (1/h) sum_i MSE of "
                 "unnormalised attention scores over real token pairs"),
        LossTerm("hidden", "sum over mapped layers of lambda_m MSE(H_S W_h, H_T) over real "
                 "tokens"),
        LossTerm("prediction", "lambda_{M+1} soft cross-entropy at temperature t to the "
                 "teacher's logits (MSE to its prediction for regression)"),
        LossTerm("gold", "cross-entropy to the gold labels (MSE for regression); trains the "
                 "head only where prediction or task distillation is switched off"),
    )

    # -- declaration ---------------------------------------------------------------------
    def _active(self, term: str) -> bool:
        return self.weights.get(term, 0.0) != 0.0

    def stage_weights(self, stage: Stage) -> dict[str, float]:
        """General distillation keeps the paper's full objective (embedding, attention and
        hidden at weight 1): the objective ablations are of task distillation, so they all
        start from one shared general TinyBERT."""
        if stage.is_general:
            return dict.fromkeys(INTERMEDIATE_TERMS, 1.0)
        return self.weights

    def general_key(self) -> dict[str, Any]:
        params = self.params
        return {"mapping": params.general_mapping or params.mapping,
                "layer_weights": params.layer_weights,
                "shared_projection": params.shared_projection,
                "weights": dict.fromkeys(INTERMEDIATE_TERMS, 1.0)}

    def stages(self, task: TaskSpec) -> list[Stage]:
        params = self.params
        stages = []
        if params.general_distillation:
            stages.append(Stage("general", INTERMEDIATE_TERMS, teacher="pretrained",
                                teacher_outputs=frozenset({"hidden_states", "attention_scores"}),
                                evaluate=False, data="corpus"))
        if not params.task_distillation:
            if not params.general_distillation:
                raise ConfigError("with neither general nor task distillation there is "
                                  "no TinyBERT left; use finetune")
            stages.append(Stage("finetune", ("gold",), teacher="none",
                                teacher_outputs=frozenset()))
            return self._need_gold(stages)
        def data(stage: str) -> str:
            return "augmented" if self.augments and stage in params.augmented_stages else "task"

        outputs = set()
        if self._active("embedding") or self._active("hidden"):
            outputs.add("hidden_states")
        if self._active("attention"):
            outputs.add("attention_scores")
        if outputs:
            stages.append(Stage("intermediate", INTERMEDIATE_TERMS, teacher="finetuned",
                                teacher_outputs=frozenset(outputs), evaluate=False,
                                data=data("intermediate")))
        if self._active("prediction"):
            stages.append(Stage("prediction", ("prediction",), teacher="finetuned",
                                teacher_outputs=frozenset({"logits"}),
                                data=data("prediction")))
        else:  # 'w/o Pred': the head learns from the gold labels of the plain task data
            stages.append(Stage("prediction", ("gold",), teacher="none",
                                teacher_outputs=frozenset()))
        return self._need_gold(stages)

    def _need_gold(self, stages: list[Stage]) -> list[Stage]:
        if any("gold" in stage.loss_terms for stage in stages) and not self._active("gold"):
            raise ConfigError("with prediction (or task) distillation off, the gold term "
                              "is what trains the student's classifier; it cannot be "
                              "disabled too")
        return stages

    @property
    def augments(self) -> bool:
        """Whether task distillation reads augmented copies of the training set."""
        params = self.params
        return params.task_distillation and params.augment and params.augmentation.copies > 0

    def missing_assets(self) -> str | None:
        """The augmentation reads GloVe neighbours (also with masked-LM candidates, for
        words of several pieces)."""
        if not self.augments:
            return None
        return glove_problem(self.params.augmentation.glove_path)

    def run_key(self) -> dict[str, Any]:
        """For the runs that train on augmented copies, the GloVe vectors their candidates
        come from, where they are not the release the shipped records were made with."""
        if not self.augments:
            return {}
        vectors = vectors_run_identity(self.params.augmentation.glove_path)
        return {"glove": vectors} if vectors else {}

    def reads_corpus(self) -> bool:
        """Masked-LM candidates come from a head fitted on the suite's corpus where the
        checkpoint has none (or ``use_checkpoint_head`` is off), so the copies, and the
        runs trained on them, differ with the corpus. Where the checkpoint's own head is
        used the corpus only measures it, but which of the two applies is known only once
        the checkpoint's weights are read, which planning a run id does not do."""
        return self.augments and self.params.augmentation.candidates == "mlm"

    def augmenter(self, context: AugmentContext) -> ContextualAugmenter | None:
        if not self.augments:
            return None
        return build_augmenter(context.checkpoint, context.tokenizer, context.corpus,
                               context.cache, self.params.augmentation, context.log)

    def student_problem(self, shape: StudentConfig, teacher_config: PretrainedConfig
                        ) -> str | None:
        """The mappings and lambdas against the depths, the head counts against the
        attention term."""
        try:
            for mapping in (self.params.mapping, self.params.general_mapping):
                if mapping is not None:
                    layer_map(shape.num_layers, teacher_config.num_hidden_layers, mapping)
            layer_weights(shape.num_layers, self.params.layer_weights)
        except ValueError as error:
            return f"params: {error}"
        teacher_heads = teacher_config.num_attention_heads
        uses_attention = self._active("attention") or self.params.general_distillation
        if uses_attention and shape.num_heads != teacher_heads:
            return (f"the attention term matches attention head by head, so the student needs "
                    f"as many heads as the teacher ({teacher_heads}), not {shape.num_heads}; "
                    f"pick a student shape with {teacher_heads} heads or disable the "
                    "attention term")
        return None

    def build_student(self, context: StudentContext) -> nn.Module:
        """The default student (of the teacher's architecture), after
        :meth:`student_problem`, so a bad recipe stops before any training."""
        self.refuse_student(context.shape, context.teacher_config)
        return super().build_student(context)

    def extra_modules(self, context: StudentContext) -> nn.ModuleDict:
        """Projections d' -> d for the active embedding / hidden terms: ``shared``, or
        ``embedding`` (W_e) and ``hidden1``..``hiddenM`` (W_h per student layer)."""
        student_width = context.shape.hidden_size
        teacher_width = context.teacher_config.hidden_size
        modules = nn.ModuleDict()
        general = self.params.general_distillation
        if self.params.shared_projection:
            if self._active("embedding") or self._active("hidden") or general:
                modules["shared"] = nn.Linear(student_width, teacher_width)
            return modules
        if self._active("embedding") or general:
            modules["embedding"] = nn.Linear(student_width, teacher_width)
        if self._active("hidden") or general:
            for layer in range(1, context.shape.num_layers + 1):
                modules[f"hidden{layer}"] = nn.Linear(student_width, teacher_width)
        return modules

    def forward_student(self, student: nn.Module, batch: dict[str, torch.Tensor],
                        stage: Stage) -> TinyBERTStudentOutput:
        """Run the student, exposing what the stage asks of the teacher: hidden states and,
        when attention scores are asked for, the student's own scores (captured per forward,
        so they hold this batch's autograd graph)."""
        model = student
        kwargs = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "token_type_ids": batch.get("token_type_ids"),
            "output_hidden_states": "hidden_states" in stage.teacher_outputs,
        }
        scores = None
        if "attention_scores" in stage.teacher_outputs:
            with capture_attention_scores(model) as capture:
                output = student(**kwargs)
            scores = capture.scores
        else:
            output = student(**kwargs)
        return TinyBERTStudentOutput(logits=output.logits, hidden_states=output.hidden_states,
                                     attention_scores=scores,
                                     num_layers=model.config.num_hidden_layers)

    def teacher_layers(self, stage: Stage, num_teacher_layers: int,
                       student: nn.Module) -> TeacherLayers | None:
        """The embedding output (embedding term) and the mapped layers g(1..M): their
        outputs (hidden term) and scores (attention term); nothing deeper than g(M)."""
        if stage.teacher == "none":
            return None
        model = student
        mapping = self.params.mapping
        if stage.is_general:
            mapping = self.params.general_mapping or mapping
        mapped = frozenset(layer_map(model.config.num_hidden_layers, num_teacher_layers,
                                     mapping))
        weights = self.stage_weights(stage)
        hidden = (({0} if weights.get("embedding", 0.0) else set())
                  | (mapped if weights.get("hidden", 0.0) else set()))
        return TeacherLayers(hidden=frozenset(hidden),
                             scores=mapped if weights.get("attention", 0.0) else frozenset())

    def search_space(self, trial: optuna.Trial) -> dict[str, Any]:
        """The paper's prediction-stage lr grid, and t, for the stages this configuration
        runs: without task distillation the lr is the ``finetune`` stage's, and t only
        where the prediction term is on (elsewhere nothing reads it, so trials that differ
        in it would train the same student)."""
        if not self.params.task_distillation:
            return {"stages.finetune.lr": trial.suggest_categorical("finetune_lr",
                                                                    [1e-5, 2e-5, 3e-5])}
        space: dict[str, Any] = {
            "stages.prediction.lr": trial.suggest_categorical("prediction_lr",
                                                              [1e-5, 2e-5, 3e-5])}
        if self._active("prediction"):
            space["params.temperature"] = trial.suggest_categorical("temperature",
                                                                    [1.0, 2.0, 4.0])
        return space

    # -- loss terms ----------------------------------------------------------------------
    def _mapping(self, inputs: StepInputs) -> list[int]:
        """g(m) for m = 1..M, from the student's depth and the teacher outputs' length."""
        if "mapping" not in inputs.cache:
            view = inputs.teacher
            num_teacher = (len(view.attention_scores) if view.attention_scores is not None
                           else len(view.hidden_states) - 1)
            mapping = self.params.mapping
            if inputs.stage.is_general:
                mapping = self.params.general_mapping or mapping
            inputs.cache["mapping"] = layer_map(inputs.student.num_layers, num_teacher, mapping)
        return inputs.cache["mapping"]

    def _lambdas(self, inputs: StepInputs) -> list[float]:
        return layer_weights(inputs.student.num_layers, self.params.layer_weights)

    def _projection(self, extra: nn.Module, layer: int) -> nn.Module:
        modules = extra
        if self.params.shared_projection:
            return modules["shared"]
        return modules["embedding"] if layer == 0 else modules[f"hidden{layer}"]

    def loss_embedding(self, inputs: StepInputs) -> torch.Tensor:
        return self._lambdas(inputs)[0] * embedding_loss(
            inputs.student.hidden_states[0], inputs.teacher.hidden_states[0],
            self._projection(inputs.extra, 0), inputs.batch["attention_mask"])

    def loss_hidden(self, inputs: StepInputs) -> torch.Tensor:
        lambdas = self._lambdas(inputs)
        student, teacher = inputs.student.hidden_states, inputs.teacher.hidden_states
        return sum(  # type: ignore[return-value]
            lambdas[m] * hidden_loss(student[m], teacher[g], self._projection(inputs.extra, m),
                                     inputs.batch["attention_mask"])
            for m, g in enumerate(self._mapping(inputs), start=1))

    def loss_attention(self, inputs: StepInputs) -> torch.Tensor:
        lambdas = self._lambdas(inputs)
        student, teacher = inputs.student.attention_scores, inputs.teacher.attention_scores
        return sum(  # type: ignore[return-value]
            lambdas[m] * attention_score_loss(student[m - 1], teacher[g - 1],
                                              inputs.batch["attention_mask"])
            for m, g in enumerate(self._mapping(inputs), start=1))

    def loss_prediction(self, inputs: StepInputs) -> torch.Tensor:
        weight = self._lambdas(inputs)[-1]
        if inputs.task.is_regression:
            return weight * teacher_regression_loss(inputs.student.logits, inputs.teacher.logits)
        return weight * soft_cross_entropy(inputs.student.logits, inputs.teacher.logits,
                                           self.params.temperature)

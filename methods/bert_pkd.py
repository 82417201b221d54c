"""BERT-PKD: Patient Knowledge Distillation (Sun et al., arXiv 1908.09355, EMNLP 2019).

The student has k Transformer layers of the teacher's width, initialised from the
pre-trained teacher's FIRST k layers (embeddings, embedding LayerNorm and pooler copied
too), then trained on the task with the fine-tuned teacher:

    L = (1 - alpha) CE(gold) + alpha T^2 KL(softmax(z_T/T) || softmax(z_S/T))
        + beta sum_{j=1..k-1} || h_S,j / ||h_S,j|| - h_T,I(j) / ||h_T,I(j)|| ||^2

h_S,j is the [CLS] (position 0) output of student Transformer layer j (``hidden_states[j]``
of transformers, 0 being the embeddings); h_T,I(j) the same of teacher layer I(j).  The
squared distance is averaged over the examples of the batch and summed over the k - 1
intermediate layers (the top layer is distilled through the logits).  [CLS] sits at
position 0 in every row, so padding never enters the patient term.

Terms (weights from :meth:`BertPKD.default_weights`, so ``loss_weights`` and
``disabled_losses`` work as for every plugin): ``gold`` (1 - alpha), ``soft`` (alpha;
exactly :func:`harness.api.losses.soft_kl`, as in ``kd``; regression tasks: MSE to the
teacher's prediction) and ``patient`` (beta).  With beta = 0 the stage asks nothing but
the cached logits of the teacher (no live teacher forward, no hidden states) and runs
exactly the arithmetic of ``kd`` on the same student.

Mappings I(j), j = 1..k-1, for teacher depth N (:func:`patient_layers`):

* ``skip`` (PKD-Skip, the default; better on most tasks in the paper): I(j) = j N / k, needs
  N divisible by k (12 -> 6: 2, 4, 6, 8, 10; 6 -> 3: 2, 4);
* ``last`` (PKD-Last): I(j) = N - k + j, the k - 1 layers below the top (12 -> 6:
  7, 8, 9, 10, 11; 6 -> 3: 4, 5);
* an explicit list of k - 1 strictly increasing teacher layers in 1..N-1.

Defaults: mapping ``skip`` (the paper's better variant); T 10, alpha 0.5, beta 100 (points
of the authors' grid, T in {5, 10, 20}, alpha in {0.2, 0.5, 0.7}, beta in {10, 100, 500,
1000}, lr in {1e-5, 2e-5, 5e-5}, which is :meth:`BertPKD.search_space`; the paper tunes them
per task and states no single default).

Where this differs from the authors' code (github.com/intersun/PKD-for-BERT-Model-
Compression): the student's and the teacher's [CLS] are normalised the same way (F.normalize
on both, as theirs with ``normalized_patience``), but their patience loss is
``F.mse_loss`` over the stacked (batch, k - 1, d) vectors, i.e. also averaged over the k - 1
layers and the d hidden dimensions, while the paper's formula (implemented here, the default
``patient_reduction: sum``) sums over both.  Their beta grid therefore corresponds to a
(k - 1) d times smaller beta here: ``patient_reduction: mean`` reproduces their scale
(divides the term by (k - 1) d); both suites use it with a beta from the grid (see
their comments).  Their teacher
predictions were cached to disk; here the logits are cached and hidden states come from a
live teacher forward.  The student shape's own ``teacher_layers`` is ignored: this plugin
copies the first k layers (or ``params.teacher_layers``).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
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
    TeacherLayers,
    dimensions,
    register_method,
    soft_target_loss,
    teacher_fit_problem,
)

if TYPE_CHECKING:
    import optuna
    from transformers import PretrainedConfig

PKDMapping = Literal["skip", "last"] | list[Annotated[int, Field(ge=1)]]


# -- mappings (pure functions) --------------------------------------------------------------
def pkd_skip(num_student: int, num_teacher: int) -> list[int]:
    """PKD-Skip: I(j) = j N / k for j = 1..k-1; needs N divisible by k."""
    _check_depths(num_student, num_teacher)
    if num_teacher % num_student:
        raise ValueError(
            f"the skip mapping I(j) = j N / k needs the teacher depth N={num_teacher} to be "
            f"a multiple of the student depth k={num_student}; give an explicit list of "
            f"{num_student - 1} teacher layers in 1..{num_teacher - 1} instead (mapping: "
            "[...])")
    step = num_teacher // num_student
    return [j * step for j in range(1, num_student)]


def pkd_last(num_student: int, num_teacher: int) -> list[int]:
    """PKD-Last: I(j) = N - k + j for j = 1..k-1, the k - 1 layers below the top."""
    _check_depths(num_student, num_teacher)
    return [num_teacher - num_student + j for j in range(1, num_student)]


def patient_layers(num_student: int, num_teacher: int,
                   mapping: Literal["skip", "last"] | list[int] = "skip") -> list[int]:
    """Teacher layer I(j) (1-based, 0 = embeddings) for student layers j = 1..k-1 (list index
    j - 1): ``skip``, ``last`` or an explicit list, checked against the depths."""
    if isinstance(mapping, str):
        if mapping == "skip":
            return pkd_skip(num_student, num_teacher)
        if mapping == "last":
            return pkd_last(num_student, num_teacher)
        raise ValueError(f"unknown PKD mapping {mapping!r}; use skip, last or an explicit "
                         "list of teacher layers")
    _check_depths(num_student, num_teacher)
    layers = list(mapping)
    if len(layers) != num_student - 1:
        raise ValueError(f"explicit mapping {layers} has {len(layers)} entries; a "
                         f"{num_student}-layer student has {num_student - 1} intermediate "
                         "layers (the top one is distilled through the logits)")
    if not all(isinstance(layer, int) and not isinstance(layer, bool) for layer in layers):
        raise ValueError(f"explicit mapping {layers} must hold integer layer numbers")
    outside = [layer for layer in layers if not 1 <= layer <= num_teacher - 1]
    if outside:
        raise ValueError(f"explicit mapping {layers}: teacher layers {outside} are outside "
                         f"1..{num_teacher - 1} (0 is the embeddings, {num_teacher} the top "
                         "layer, which the logits already distil)")
    if any(later <= earlier for earlier, later in itertools.pairwise(layers)):
        raise ValueError(f"explicit mapping {layers} must be strictly increasing")
    return layers


def _check_depths(num_student: int, num_teacher: int) -> None:
    for name, value in (("student depth", num_student), ("teacher depth", num_teacher)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if num_student > num_teacher:
        raise ValueError(f"a {num_student}-layer student cannot take its layers from a "
                         f"{num_teacher}-layer teacher")


# -- the patient term -------------------------------------------------------------------------
def patient_loss(student_hidden: tuple[torch.Tensor, ...] | list[torch.Tensor],
                 teacher_hidden: tuple[torch.Tensor, ...] | list[torch.Tensor],
                 mapping: list[int], reduction: Literal["sum", "mean"] = "sum"
                 ) -> torch.Tensor:
    """sum_{j=1..k-1} mean over the batch of || h_S,j/||h_S,j|| - h_T,I(j)/||h_T,I(j)|| ||^2.

    ``student_hidden`` / ``teacher_hidden``: transformers' ``hidden_states`` (index 0 the
    embeddings, j the output of Transformer layer j), each (batch, length, d); only
    position 0 ([CLS]) is read.  ``mapping[j - 1]`` = I(j).  ``reduction="mean"`` also
    averages over the k - 1 layers and the d dimensions (the authors' ``F.mse_loss``).
    """
    if not mapping:
        raise ValueError("the patient term needs at least one intermediate student layer")
    total = None
    for j, teacher_layer in enumerate(mapping, start=1):
        student_cls = F.normalize(student_hidden[j][:, 0].float(), p=2, dim=-1)
        teacher_cls = F.normalize(teacher_hidden[teacher_layer][:, 0].float(), p=2, dim=-1)
        value = (student_cls - teacher_cls).pow(2).sum(dim=-1).mean()
        total = value if total is None else total + value
    if reduction == "mean":
        total = total / (len(mapping) * student_hidden[1].shape[-1])
    return total


# -- the plugin -----------------------------------------------------------------------------
@register_method
class BertPKD(Method):
    name = "bert-pkd"
    description = ("BERT-PKD: KD from the fine-tuned teacher plus normalised [CLS] states of "
                   "intermediate layers (PKD-Skip / PKD-Last); student = teacher's first k "
                   "layers")

    class Params(MethodParams):
        alpha: float = Field(0.5, ge=0, le=1, description="weight of the soft-target term "
                             "(gold: 1 - alpha)")
        temperature: float = Field(10.0, gt=0, description="T of the soft-target term")
        beta: float = Field(100.0, ge=0, description="weight of the patient term (0: vanilla "
                            "KD, no teacher forward)")
        mapping: PKDMapping = Field(
            "skip", description="teacher layer I(j) of student layers j = 1..k-1: skip "
            "(I(j) = jN/k), last (I(j) = N-k+j) or an explicit list of k-1 layers in 1..N-1")
        teacher_layers: list[Annotated[int, Field(ge=0)]] | None = Field(
            None, description="teacher layers (0-based) copied into the student; default: "
            "the first k")
        patient_reduction: Literal["sum", "mean"] = Field(
            "sum", description="sum: the paper's formula (squared distances summed over "
            "dimensions and layers); mean: the authors' code (F.mse_loss: also averaged over "
            "the k-1 layers and d dimensions), the scale their beta grid was tuned on")

    loss_terms = (
        LossTerm("gold", "cross-entropy (MSE for regression) to gold labels"),
        LossTerm("soft", "T^2 KL to the teacher's soft targets (MSE to its prediction for "
                 "regression)"),
        LossTerm("patient", "sum over intermediate student layers of the squared distance "
                 "between unit-normalised [CLS] states of the student and its mapped "
                 "teacher layer, mean over the batch"),
    )

    def _patient_active(self) -> bool:
        return self.weights.get("patient", 0.0) != 0.0

    def stages(self, task: TaskSpec) -> list[Stage]:
        outputs = {"logits", "hidden_states"} if self._patient_active() else {"logits"}
        return [Stage("task", ("gold", "soft", "patient"), teacher="finetuned",
                      teacher_outputs=frozenset(outputs))]

    def default_weights(self) -> dict[str, float]:
        return {"gold": 1.0 - self.params.alpha, "soft": self.params.alpha,
                "patient": self.params.beta}

    def student_problem(self, shape: StudentConfig, teacher_config: PretrainedConfig
                        ) -> str | None:
        """The student is made of copies of teacher layers (the core's
        :func:`teacher_fit_problem` on the shape as built: the teacher's widths, layers it
        has), and a patient mapping that fits both depths."""
        dims = dimensions(teacher_config)
        num_student, num_teacher = shape.num_layers, dims.layers
        layers = self.params.teacher_layers
        if layers is not None and (len(layers) != num_student
                                   or any(layer >= num_teacher for layer in layers)):
            return (f"params.teacher_layers: {layers} must name {num_student} teacher layers "
                    f"(one per student layer) in 0..{num_teacher - 1}")
        if problem := teacher_fit_problem(self.copied_shape(shape), dims):
            return problem
        try:
            mapping = patient_layers(num_student, num_teacher, self.params.mapping)
        except ValueError as error:
            return f"params.mapping: {error}"
        if self._patient_active() and not mapping:
            return ("a 1-layer student has no intermediate layer for the patient term; set "
                    "beta to 0 (vanilla KD) or use more layers")
        return None

    def build_student(self, context: StudentContext) -> nn.Module:
        """The suite's shape, with its Transformer layers copied from the teacher's first k
        (or ``params.teacher_layers``) and its embeddings from the teacher's, after
        :meth:`student_problem`, so a bad recipe fails before training."""
        from harness.api.students import build_encoder_student

        shape, teacher = context.shape, context.teacher_config
        self.refuse_student(shape, teacher)
        if context.teacher_state is None:
            raise ConfigError(f"methods.{self.name}: no teacher weights to copy; pass the "
                              "pre-trained teacher's state_dict as "
                              "StudentContext.teacher_state")
        return build_encoder_student(replace(context, shape=self.copied_shape(shape),
                                             teacher_config=teacher))

    def copied_shape(self, shape: StudentConfig) -> StudentConfig:
        """The suite's shape as this method builds it: its layers copies of the teacher's
        first k (or ``params.teacher_layers``), its embeddings the teacher's."""
        layers = self.params.teacher_layers
        if layers is None:  # the first k
            layers = list(range(shape.num_layers))
        return shape.model_copy(update={"init": "teacher_layers", "teacher_layers": layers,
                                        "embedding_init": "teacher"})

    def teacher_layers(self, stage: Stage, num_teacher_layers: int,
                       student: nn.Module) -> TeacherLayers | None:
        """The patient term reads teacher layers I(1..k-1) only (their [CLS] states): the
        live teacher stops after I(k-1), e.g. layer 4 of 6 for PKD-Skip 6 -> 3."""
        model = student
        layers = patient_layers(model.config.num_hidden_layers, num_teacher_layers,
                                self.params.mapping)
        return TeacherLayers(hidden=frozenset(layers))

    def search_space(self, trial: optuna.Trial) -> dict[str, Any]:
        """The authors' grid; beta only where the patient term is on (a configuration
        without it, such as ``beta: 0``, is the KD control, which a beta from the grid would
        turn into PKD)."""
        space = {
            "params.temperature": trial.suggest_categorical("temperature", [5.0, 10.0, 20.0]),
            "params.alpha": trial.suggest_categorical("alpha", [0.2, 0.5, 0.7]),
        }
        if self._patient_active():
            space["params.beta"] = trial.suggest_categorical("beta",
                                                             [10.0, 100.0, 500.0, 1000.0])
        space["stages.task.lr"] = trial.suggest_categorical("lr", [1e-5, 2e-5, 5e-5])
        return space

    # -- loss terms ----------------------------------------------------------------------
    def loss_soft(self, inputs: StepInputs) -> torch.Tensor:
        return soft_target_loss(inputs.student.logits, inputs.teacher.logits,
                                self.params.temperature, inputs.task.is_regression)

    def loss_patient(self, inputs: StepInputs) -> torch.Tensor:
        student, teacher = inputs.student.hidden_states, inputs.teacher.hidden_states
        mapping = patient_layers(len(student) - 1, len(teacher) - 1, self.params.mapping)
        return patient_loss(student, teacher, mapping, self.params.patient_reduction)

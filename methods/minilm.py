"""MiniLM: deep self-attention distillation (Wang et al., NeurIPS 2020, arXiv 2002.10957).

General distillation on unlabeled text transfers the self-attention of the teacher's LAST
Transformer layer to the student's last layer, so the student's depth and width are free
(the relations are length x length; no projection is needed). Only the number of heads
must match. Two terms, each a KL divergence per head and per query position, averaged
over heads and real query tokens:

* ``attention``: KL(A_T || A_S), A = softmax(Q K^T / sqrt(d_k)) (the attention
  distributions, padded keys masked);
* ``value_relation``: KL(VR_T || VR_S), VR = softmax(V V^T / sqrt(d_k)), d_k the head size
  of the model at hand.

The distilled student is then fine-tuned on each task (the paper's GLUE protocol): the
``gold`` term. ``task_objective: kd`` distils the fine-tuned teacher's predictions instead
(Hinton KD with ``alpha`` and ``temperature``), a task-stage variant the paper does not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from harness.api import (
    GOLD,
    LossTerm,
    Method,
    MethodParams,
    Stage,
    StepInputs,
    StudentConfig,
    StudentContext,
    TaskSpec,
    TeacherLayers,
    build_encoder_student,
    register_method,
    soft_target_loss,
    token_pair_mask,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GENERAL_TERMS = ("attention", "value_relation")


def _relation_kl(teacher: torch.Tensor, student: torch.Tensor, attention_mask: torch.Tensor
                 ) -> torch.Tensor:
    """Mean over heads and real query tokens of KL(softmax(teacher) || softmax(student))
    along the key axis, for (batch, heads, length, length) relation logits; padded keys
    are left out of both distributions, padded queries out of the mean."""
    real = token_pair_mask(attention_mask)  # (batch, 1, length, length)
    minimum = torch.finfo(torch.float32).min
    teacher_log = F.log_softmax(teacher.float().masked_fill(~real, minimum), dim=-1)
    student_log = F.log_softmax(student.float().masked_fill(~real, minimum), dim=-1)
    pointwise = teacher_log.exp() * (teacher_log - student_log)
    per_query = pointwise.masked_fill(~real, 0.0).sum(-1)  # (batch, heads, length)
    queries = attention_mask.bool()[:, None, :].expand_as(per_query)
    return per_query[queries].mean()


def value_relation(values: torch.Tensor) -> torch.Tensor:
    """V V^T / sqrt(d_k) per head, for (batch, heads, length, head_dim) values."""
    return values @ values.transpose(-1, -2) / values.shape[-1] ** 0.5


@register_method
class MiniLM(Method):
    name = "minilm"
    description = ("MiniLM: KL on the last layer's attention distributions and value "
                   "relations (general distillation), then task fine-tuning")

    class Params(MethodParams):
        task_objective: Literal["finetune", "kd"] = Field(
            "finetune", description="the task stage: gold labels (the paper), or Hinton KD "
            "from the fine-tuned teacher")
        alpha: float = Field(0.5, ge=0, le=1, description="kd: weight of the soft term")
        temperature: float = Field(2.0, gt=0, description="kd: softmax temperature")

    loss_terms = (
        LossTerm("attention", "KL between the last layers' self-attention distributions"),
        LossTerm("value_relation", "KL between the last layers' value relations "
                 "softmax(V V^T / sqrt(d_k))"),
        GOLD,
        LossTerm("soft", "task_objective kd: T^2 KL to the teacher's soft targets (MSE to "
                 "its prediction for regression)"),
    )

    def default_weights(self) -> dict[str, float]:
        kd = self.params.task_objective == "kd"
        return {"attention": 1.0, "value_relation": 1.0,
                "gold": 1.0 - self.params.alpha if kd else 1.0,
                "soft": self.params.alpha if kd else 0.0}

    def stages(self, task: TaskSpec) -> list[Stage]:
        last_layer = frozenset({"attention_scores", "values"})
        general = Stage("general", GENERAL_TERMS, teacher="pretrained",
                        teacher_outputs=last_layer, student_outputs=last_layer,
                        evaluate=False, data="corpus")
        if self.params.task_objective == "kd":
            task_stage = Stage("task", ("gold", "soft"), teacher="finetuned",
                               teacher_outputs=frozenset({"logits"}))
        else:
            task_stage = Stage("task", ("gold",), teacher="none", teacher_outputs=frozenset())
        return [general, task_stage]

    def general_key(self) -> dict[str, Any]:
        # The task stage's objective does not touch the general checkpoint.
        return {"weights": {term: self.weights[term] for term in GENERAL_TERMS}}

    def student_problem(self, shape: StudentConfig, teacher_config: PretrainedConfig
                        ) -> str | None:
        heads = teacher_config.num_attention_heads
        if shape.num_heads != heads:
            return (f"the student has {shape.num_heads} heads, the teacher {heads}; MiniLM "
                    "compares attention head by head, so they must match")
        return None

    def build_student(self, context: StudentContext) -> nn.Module:
        self.refuse_student(context.shape, context.teacher_config)
        return build_encoder_student(context)

    def teacher_layers(self, stage: Stage, num_teacher_layers: int,
                       student: nn.Module) -> TeacherLayers | None:
        """The teacher's last layer only (its scores and values)."""
        return TeacherLayers(scores=frozenset({num_teacher_layers}))

    def loss_attention(self, inputs: StepInputs) -> torch.Tensor:
        return _relation_kl(inputs.teacher.attention_scores[-1],
                            inputs.student.attention_scores[-1], inputs.batch["attention_mask"])

    def loss_value_relation(self, inputs: StepInputs) -> torch.Tensor:
        return _relation_kl(value_relation(inputs.teacher.values[-1].float()),
                            value_relation(inputs.student.values[-1].float()),
                            inputs.batch["attention_mask"])

    def loss_soft(self, inputs: StepInputs) -> torch.Tensor:
        return soft_target_loss(inputs.student.logits, inputs.teacher.logits,
                                self.params.temperature, inputs.task.is_regression)

    def search_space(self, trial) -> dict:
        return {"stages.task.lr": trial.suggest_float("lr", 1e-5, 1e-3, log=True)}

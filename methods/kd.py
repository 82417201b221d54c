"""Vanilla knowledge distillation (Hinton et al., arXiv 1503.02531).

Loss = (1 - alpha) * CE(gold) + alpha * T^2 * KL(softmax(z_T/T) || softmax(z_S/T)).
For regression tasks the soft term is the MSE to the teacher's prediction.
"""

from __future__ import annotations

import torch
from pydantic import Field

from harness.api import (
    LossTerm,
    Method,
    MethodParams,
    Stage,
    StepInputs,
    TaskSpec,
    register_method,
    soft_target_loss,
)


@register_method
class VanillaKD(Method):
    name = "kd"
    description = "Hinton KD: (1 - alpha) CE(gold) + alpha T^2 KL(teacher || student)"

    class Params(MethodParams):
        alpha: float = Field(0.5, ge=0, le=1, description="weight of the soft-target term")
        temperature: float = Field(2.0, gt=0)

    loss_terms = (
        LossTerm("gold", "cross-entropy (MSE for regression) to gold labels"),
        LossTerm("soft", "T^2 KL to the teacher's soft targets (MSE to its prediction for "
                 "regression)"),
    )

    def stages(self, task: TaskSpec) -> list[Stage]:
        return [Stage("task", ("gold", "soft"), teacher="finetuned",
                      teacher_outputs=frozenset({"logits"}))]

    def default_weights(self) -> dict[str, float]:
        return {"gold": 1.0 - self.params.alpha, "soft": self.params.alpha}

    def loss_soft(self, inputs: StepInputs) -> torch.Tensor:
        return soft_target_loss(inputs.student.logits, inputs.teacher.logits,
                                self.params.temperature, inputs.task.is_regression)

    def search_space(self, trial) -> dict:
        # lr up to 1e-3: small students trained from random weights take larger steps than
        # BERT fine-tuning's 2e-5..1e-4.
        return {
            "params.alpha": trial.suggest_float("alpha", 0.1, 0.9),
            "params.temperature": trial.suggest_categorical("temperature", [1.0, 2.0, 4.0, 8.0]),
            "stages.task.lr": trial.suggest_float("lr", 1e-5, 1e-3, log=True),
        }

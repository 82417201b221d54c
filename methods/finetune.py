"""No-KD baseline: the student trained on gold labels only."""

from __future__ import annotations

from harness.api import (
    LossTerm,
    Method,
    Stage,
    TaskSpec,
    register_method,
)


@register_method
class FineTune(Method):
    name = "finetune"
    description = "no distillation: the student fine-tuned on gold labels (baseline)"
    loss_terms = (LossTerm("gold", "cross-entropy (MSE for regression) to gold labels"),)

    def stages(self, task: TaskSpec) -> list[Stage]:
        return [Stage("task", ("gold",), teacher="none", teacher_outputs=frozenset())]

    def search_space(self, trial) -> dict:
        return {"stages.task.lr": trial.suggest_float("lr", 1e-5, 3e-4, log=True)}

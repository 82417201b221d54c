"""Dev evaluation during a stage and the checkpoint it ends with
(:mod:`harness.training.evaluation`), on a tiny real BERT classifier: when it evaluates,
what it records and reports, the best weights ``best-dev`` keeps (the first of equal
scores), and dev logits that are not finite stopping the stage."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from torch import nn

from harness.api.method import Stage
from harness.data.metrics import TaskEvaluator
from harness.training.evaluation import CheckpointSelection, DevEvaluation
from harness.training.prediction import predict_logits
from harness.training.results import NonFiniteLossError, StageResult
from tests.teacher.test_engine_teacher_outputs import TASK, tiny_classifier, tiny_split

STAGE = Stage("task", ("gold",), teacher="none", teacher_outputs=frozenset())


def weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def perturbed(model: nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)


@pytest.mark.parametrize("selection", ["last", "best-dev"])
def test_the_selection_keeps_the_first_best_weights_under_best_dev_only(selection) -> None:
    model = tiny_classifier(1, seed=1)
    chosen = CheckpointSelection(selection)
    result = StageResult(name="task")
    best = weights(model)
    for step, score in ((2, 60.0), (4, 60.0), (6, 55.0)):  # the first 60 is the best
        chosen.offer(score, {"accuracy": score}, step, result, model)
        perturbed(model, seed=step)
    last = weights(model)
    assert (result.best_step, result.best_metrics, chosen.best_score) == (
        2, {"accuracy": 60.0}, 60.0)
    chosen.load_selected(model)
    torch.testing.assert_close(weights(model), best if selection == "best-dev" else last)
    restored = CheckpointSelection(selection)
    restored.restore(chosen.state())
    assert restored.best_score == 60.0
    assert (restored.best_state is None) == (selection == "last")


def evaluation(model: nn.Module, *, every: int = 2, total: int = 5, stage: Stage = STAGE,
               predict=predict_logits, seen: list | None = None) -> DevEvaluation:
    """Evaluations of ``model``, through a forward of its own as a method's is."""
    split = tiny_split(10)
    return DevEvaluation(
        stage=stage, split=split, evaluator=TaskEvaluator(TASK), every_steps=every,
        total_steps=total, batch_size=4, accelerator=Accelerator(cpu=True),
        selection=CheckpointSelection("best-dev"),
        forward=lambda batch: model(input_ids=batch["input_ids"],
                                    attention_mask=batch["attention_mask"]),
        predict=predict, on_evaluate=seen.append if seen is not None else None)


def test_it_evaluates_every_n_steps_and_at_the_last() -> None:
    model = tiny_classifier(1, seed=1)
    assert [step for step in range(1, 6) if evaluation(model).due(step)] == [2, 4, 5]
    quiet = Stage("general", ("gold",), teacher="none", teacher_outputs=frozenset(),
                  evaluate=False)
    assert not any(evaluation(model, stage=quiet).due(step) for step in range(1, 6))


def test_an_evaluation_is_recorded_reported_and_offered() -> None:
    seen: list[dict] = []
    student = tiny_classifier(1, seed=1).train()
    dev = evaluation(student, seen=seen)
    result = StageResult(name="task")
    dev.run(student, student, result, step=2, epoch=0.5)
    [entry] = result.evaluations
    expected = TaskEvaluator(TASK).score(
        predict_logits(student, dev.split, dev.accelerator, 4, forward=dev.forward),
        dev.split.labels)
    assert entry == {"step": 2, "epoch": 0.5, **expected}
    assert seen == [{"stage": "task", "step": 2, "epoch": 0.5, "metrics": expected,
                     "main": expected["accuracy"]}]
    assert result.best_step == 2 and dev.selection.best_score == expected["accuracy"]
    assert student.training  # trains again after


def test_dev_logits_that_are_not_finite_stop_the_stage() -> None:
    def with_a_nan(*args, **kwargs) -> np.ndarray:
        logits = predict_logits(*args, **kwargs)
        logits[1, 0] = math.nan
        return logits

    student = tiny_classifier(1, seed=1)
    dev = evaluation(student, predict=with_a_nan)
    result = StageResult(name="task")
    with pytest.raises(NonFiniteLossError, match="non-finite dev logits in stage 'task' at "
                                                 "step 4: values=1"):
        dev.run(student, student, result, step=4, epoch=1.0)
    assert result.evaluations == [] and result.best_step is None

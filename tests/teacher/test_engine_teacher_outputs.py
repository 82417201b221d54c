"""The training loop hands a stage the live-teacher outputs it asks for, attention scores
included, on tiny random models."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification

import harness.teacher.outputs
from harness.api.method import LossTerm, Method, MethodParams, Stage, StepInputs
from harness.api.students import classifier_config
from harness.config.schema import TrainConfig
from harness.data.features import EncodedSplit
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task
from harness.teacher.outputs import TeacherRuntime
from harness.training.engine import train_stage

VOCAB, LAYERS, HEADS = 50, 3, 4
TASK = get_task("rte")


class Probe(Method):
    """Records the teacher view of every step (not a registered method)."""

    name = "probe"
    loss_terms = (LossTerm("probe", "student logits squared"),)

    def __init__(self, outputs: set[str], teacher: torch.nn.Module) -> None:
        super().__init__(MethodParams(), {"probe": 1.0})
        self.stage = Stage("probe", ("probe",), teacher_outputs=frozenset(outputs),
                           evaluate=False)
        self.teacher = teacher
        self.seen: list[tuple[dict[str, torch.Tensor], object, str]] = []

    def stages(self, task) -> list[Stage]:
        return [self.stage]

    def loss_probe(self, inputs: StepInputs) -> torch.Tensor:
        self.seen.append((inputs.batch, inputs.teacher,
                          self.teacher.config._attn_implementation))
        return inputs.student.logits.float().pow(2).mean()


def tiny_classifier(layers: int, seed: int) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=layers,
                        num_attention_heads=HEADS, intermediate_size=32,
                        max_position_embeddings=32)
    return BertForSequenceClassification(classifier_config(config, TASK))


def tiny_split(rows: int = 12) -> EncodedSplit:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 10, rows)
    return EncodedSplit(name="train",
                        input_ids=[rng.integers(1, VOCAB, length) for length in lengths],
                        token_type_ids=[np.zeros(length, dtype=np.int64) for length in lengths],
                        labels=rng.integers(0, 2, rows), lengths=lengths)


def run_probe(method: Probe, runtime: TeacherRuntime) -> None:
    train_stage(method=method, stage=method.stage, student=tiny_classifier(2, seed=1),
                extra=torch.nn.ModuleDict(), config=TrainConfig(max_steps=3, batch_size=5),
                train_split=tiny_split(), eval_split=None, evaluator=TaskEvaluator(TASK),
                teacher=runtime, accelerator=Accelerator(), seed=0)


@pytest.fixture
def capture_entries(monkeypatch) -> list[int]:
    """Counts how often the engine enters the score capture."""
    entries: list[int] = []
    original = harness.teacher.outputs.capture_attention_scores

    @contextmanager
    def counting(model, *args, **kwargs):
        entries.append(1)
        with original(model, *args, **kwargs) as capture:
            yield capture

    monkeypatch.setattr(harness.teacher.outputs, "capture_attention_scores", counting)
    return entries


@pytest.mark.slow
def test_attention_scores_of_every_teacher_layer_each_step_captured_once_per_stage(
        capture_entries):
    teacher = tiny_classifier(LAYERS, seed=0)
    method = Probe({"hidden_states", "attention_scores"}, teacher)
    run_probe(method, TeacherRuntime(model=teacher))
    assert len(capture_entries) == 1
    assert len(method.seen) == 3
    assert {implementation for _, _, implementation in method.seen} == {"harness_scores"}
    assert teacher.config._attn_implementation == "sdpa"  # restored after the stage
    assert not any(hasattr(module, "_harness_score_capture") for module in teacher.modules())

    teacher.set_attn_implementation("eager")
    for batch, view, _ in method.seen:
        assert view.logits is None and view.attentions is None
        assert len(view.attention_scores) == LAYERS and len(view.hidden_states) == LAYERS + 1
        with torch.no_grad():
            eager = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            token_type_ids=batch["token_type_ids"], output_attentions=True,
                            output_hidden_states=True)
        for scores, probabilities in zip(view.attention_scores, eager.attentions, strict=True):
            assert scores.shape == (batch["input_ids"].shape[0], HEADS,
                                    *batch["input_ids"].shape[1:] * 2)
            torch.testing.assert_close(scores.softmax(-1), probabilities, rtol=0, atol=1e-6)
        for ours, reference in zip(view.hidden_states, eager.hidden_states, strict=True):
            torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_stages_without_attention_scores_do_not_capture(capture_entries):
    teacher = tiny_classifier(LAYERS, seed=0)
    method = Probe({"hidden_states"}, teacher)
    run_probe(method, TeacherRuntime(model=teacher))
    assert not capture_entries
    assert {implementation for _, _, implementation in method.seen} == {"sdpa"}
    assert all(view.attention_scores is None and len(view.hidden_states) == LAYERS + 1
               for _, view, _ in method.seen)


def test_live_teacher_outputs_without_a_teacher_model_are_refused():
    method = Probe({"logits", "attention_scores"}, tiny_classifier(LAYERS, seed=0))
    with pytest.raises(ValueError, match=r"\['attention_scores'\].*live teacher model"):
        run_probe(method, TeacherRuntime(train_logits=np.zeros((12, 2), dtype=np.float32)))

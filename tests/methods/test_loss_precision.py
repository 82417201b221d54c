"""Loss terms run in float32 outside the stage's autocast: a plugin's ``.float()`` then means
float32, as minilm's value relation intends; a term may ask for autocast instead."""

from __future__ import annotations

import math

import torch
from accelerate import Accelerator

from harness.api import LossTerm, StepInputs
from harness.api.method import StudentOutputs, TeacherView
from harness.common.precision import to_float32
from harness.data.tasks import get_task
from harness.training.engine import autocast, step_losses
from methods.minilm import MiniLM, _relation_kl, value_relation

LENGTHS = (7, 5, 6)
LENGTH = max(LENGTHS)


def _bf16_inputs(method: MiniLM, seed: int = 0) -> StepInputs:
    """A general-stage step whose forward passes ran under bf16 autocast: the values the
    models produced are bf16, as autocast's matmuls return them."""
    generator = torch.Generator().manual_seed(seed)
    teacher_values = (torch.randn(len(LENGTHS), 2, LENGTH, 32, generator=generator) * 4
                      ).bfloat16()
    student_values = (torch.randn(len(LENGTHS), 2, LENGTH, 16, generator=generator) * 4
                      ).bfloat16()
    mask = torch.tensor([[1] * n + [0] * (LENGTH - n) for n in LENGTHS])
    scores = torch.zeros(len(LENGTHS), 2, LENGTH, LENGTH, dtype=torch.bfloat16)
    stage = method.stages(get_task("rte"))[0]
    return StepInputs(
        batch={"attention_mask": mask},
        student=StudentOutputs(logits=torch.zeros(3, 2), values=[student_values],
                               attention_scores=[scores]),
        teacher=TeacherView(values=[teacher_values], attention_scores=[scores]),
        task=get_task("rte"), stage=stage, extra=torch.nn.ModuleDict())


def _float64_reference(inputs: StepInputs) -> float:
    teacher = inputs.teacher.values[-1].double()
    student = inputs.student.values[-1].double()
    return float(_relation_kl(value_relation(teacher), value_relation(student),
                              inputs.batch["attention_mask"]))


def test_minilm_value_relation_is_computed_in_float32_under_bf16_autocast():
    method = MiniLM(MiniLM.Params(), {"attention": 0.0, "value_relation": 1.0, "gold": 1.0})
    accelerator = Accelerator(cpu=True)
    inputs = _bf16_inputs(method)
    reference = _float64_reference(inputs)
    values = step_losses(method, inputs, accelerator, "bf16")
    assert set(values) == {"value_relation"}
    assert values["value_relation"].dtype == torch.float32
    assert math.isclose(float(values["value_relation"]), reference, rel_tol=1e-5)
    # Inside the autocast (where the terms used to run) the plugin's .float() does not keep
    # V V^T out of bf16, and the term is visibly off.
    with autocast(accelerator, "bf16"):
        inside = method.compute_losses(inputs)["value_relation"]
    assert not math.isclose(float(inside), reference, rel_tol=1e-3)


def test_fp32_steps_compute_the_same_objects_as_before():
    """In an fp32 stage nothing is copied: the terms see the very tensors the forward made."""
    outputs = StudentOutputs(logits=torch.randn(2, 3), hidden_states=(torch.randn(2, 4),))
    assert to_float32(outputs) is outputs
    half = StudentOutputs(logits=torch.randn(2, 3).bfloat16(),
                          hidden_states=(torch.randn(2, 4), torch.randn(2, 4).half()))
    converted = to_float32(half)
    assert converted.logits.dtype == torch.float32
    assert converted.hidden_states[0] is half.hidden_states[0]
    assert converted.hidden_states[1].dtype == torch.float32
    assert isinstance(converted.hidden_states, tuple)


def test_a_term_that_declares_autocast_runs_under_the_stages_autocast():
    seen: dict[str, torch.dtype] = {}

    class Probe(MiniLM):
        name = "probe-autocast"
        loss_terms = (*MiniLM.loss_terms[:-1],
                      LossTerm("value_relation", "value relations", autocast=True))

        def loss_value_relation(self, inputs: StepInputs) -> torch.Tensor:
            values = inputs.student.values[-1]
            seen["input"] = values.dtype
            product = values @ values.transpose(-1, -2)
            seen["matmul"] = product.dtype
            return product.float().mean()

        def loss_attention(self, inputs: StepInputs) -> torch.Tensor:
            values = inputs.student.values[-1]
            seen["attention matmul"] = (values @ values.transpose(-1, -2)).dtype
            return values.mean()

    method = Probe(MiniLM.Params(), {"attention": 1.0, "value_relation": 1.0, "gold": 1.0})
    step_losses(method, _bf16_inputs(method), Accelerator(cpu=True), "bf16")
    assert seen == {"input": torch.float32, "matmul": torch.bfloat16,
                    "attention matmul": torch.float32}

"""The plugin contract: every registered method runs end to end on tiny random models.

A new plugin is covered as soon as it is registered: it must build its student, run each
of its stages through the engine, produce finite values for every active loss term, and
leave a finished record with metrics for a classification and a regression task.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.api.registry import registry
from harness.data.tasks import get_task
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite


@pytest.mark.e2e
@pytest.mark.parametrize("method", registry.names())
def test_every_method_runs_a_short_training_on_tiny_models(method, tiny_suite_file, tmp_path):
    suite = load_suite(str(tiny_suite_file))
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    for task in ("rte", "stsb"):
        outcome = runner.run_one(method, task, seed=1)
        assert outcome.status == "finished", outcome
        record = runner.store.load(outcome.path)
        active = {name for name, weight in record.config["loss_weights"].items() if weight}
        logged = set(record.final_losses) - {"total"}
        assert logged <= active and logged, (logged, active)
        assert all(math.isfinite(value) for value in record.final_losses.values())
        assert record.stages and all(stage.steps > 0 for stage in record.stages)
        main = record.dev["dev"][record.main_metric]
        assert math.isfinite(main) and main == record.main_score
        assert record.parameters.total > record.parameters.non_embedding > 0


@pytest.mark.e2e
@pytest.mark.parametrize("method", registry.names())
def test_every_enabled_loss_term_sends_a_gradient_to_the_student(method, tiny_suite_file,
                                                                 tmp_path, monkeypatch):
    """Each active term of each stage, on its first step, has a non-zero gradient on some
    student parameter: a term that only trains the extra modules (or nothing) is a bug."""
    from harness.api.method import Method

    cls = registry.get(method)
    students: list = []
    checked: dict[str, set[str]] = {}
    original_forward = cls.forward_student
    original_losses = Method.compute_losses

    def forward_student(self, student, batch, stage):
        students.append(student)
        return original_forward(self, student, batch, stage)

    def compute_losses(self, inputs):
        values = original_losses(self, inputs)
        stage = inputs.stage.name
        if isinstance(self, cls) and stage not in checked and torch.is_grad_enabled():
            parameters = [p for p in students[-1].parameters() if p.requires_grad]
            reached = set()
            for name, value in values.items():
                grads = torch.autograd.grad(value, parameters, retain_graph=True,
                                            allow_unused=True)
                if any(g is not None and bool(g.abs().sum() > 0) for g in grads):
                    reached.add(name)
            assert reached == set(values), (stage, sorted(set(values) - reached))
            checked[stage] = set(values)
        return values

    monkeypatch.setattr(cls, "forward_student", forward_student)
    monkeypatch.setattr(Method, "compute_losses", compute_losses)
    suite = load_suite(str(tiny_suite_file))
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    outcome = runner.run_one(method, "rte", seed=1)
    assert outcome.status == "finished", outcome
    resolved = runner.planner.resolve(method, "rte", 1).method
    stages = {stage.name for stage in resolved.stages(get_task("rte"))}
    assert set(checked) == stages and all(checked.values()), (checked, stages)

"""The plugin contract: every registered method runs end to end on tiny random models.

A new plugin is covered as soon as it is registered: it must build its student, run each
of its stages through the engine, produce finite values for every active loss term, and
leave a finished record with metrics for a classification and a regression task.
"""

from __future__ import annotations

import math

import pytest

from harness.api.registry import registry
from harness.config.schema import load_suite
from harness.experiments.runner import SuiteRunner


@pytest.mark.parametrize("method", registry.names())
def test_every_method_runs_a_short_training_on_tiny_models(method, tiny_suite_file, tmp_path):
    suite = load_suite(str(tiny_suite_file))
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    for task in ("rte", "stsb"):
        outcome = runner.run_one(method, task, seed=1)
        assert outcome.status == "finished", outcome
        record = runner.store.load(outcome.path)
        active = {name for name, weight in record["config"]["loss_weights"].items() if weight}
        logged = set(record["final_losses"]) - {"total"}
        assert logged <= active and logged, (logged, active)
        assert all(math.isfinite(value) for value in record["final_losses"].values())
        assert record["stages"] and all(stage["steps"] > 0 for stage in record["stages"])
        main = record["dev"]["dev"][record["main_metric"]]
        assert math.isfinite(main) and main == record["main_score"]
        assert record["parameters"]["total"] > record["parameters"]["non_embedding"] > 0

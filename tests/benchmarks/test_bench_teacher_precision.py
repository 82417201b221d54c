
"""`python -m benchmarks teacher-precision`: the teacher's logits in fp32 and bf16 on a tiny
suite, both precisions in one table."""

from __future__ import annotations

import pytest

from benchmarks.teacher_precision import run_precision_benchmark


@pytest.mark.e2e
def test_precision_benchmark_reports_both_precisions(tiny_suite_file, tmp_path):
    result = run_precision_benchmark(suite=str(tiny_suite_file), tasks=["rte"], train_rows=8,
                                     batch_size=16, cache_dir=tmp_path / "cache",
                                     log=lambda _: None)
    rows = {(row["split"], row["precision"]): row for row in result["rows"]}
    assert set(rows) == {(split, precision) for split in ("dev", "train[:8]")
                         for precision in ("fp32", "bf16")}
    assert rows["dev", "fp32"]["max_abs_diff"] == 0.0
    assert rows["dev", "bf16"]["score"] is not None
    assert 0 <= rows["dev", "bf16"]["argmax_agreement"] <= 100
    assert any("| rte dev | 24 | bf16 |" in line for line in result["table"])

"""``auto`` precision: chosen from the CPU's flags, resolved in a suite before any run id."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from harness.common.cache import content_hash
from harness.common.precision import (
    BF16,
    FP32,
    auto_precision,
    cpu_flags,
    native_bf16,
    resolve_auto_precision,
)
from harness.config.schema import with_resolved_precision
from harness.experiments.suites import load_suite
from tests.conftest import tiny_suite_dict

CPU = torch.device("cpu")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512_bf16\n\n"
                       "processor\t: 1\nflags\t\t: fpu sse avx2 avx512_bf16\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()


def test_bf16_only_with_native_bf16_arithmetic() -> None:
    assert not native_bf16(CPU, {"avx2", "fma", "avx512f"})
    assert native_bf16(CPU, {"avx2", "avx512_bf16"})
    assert native_bf16(CPU, {"amx_bf16", "amx_tile"})
    assert auto_precision(CPU, {"avx2"}) == {"mixed_precision": "no",
                                             "inference_precision": "fp32"}
    assert auto_precision(CPU, {"amx_bf16"}) == {"mixed_precision": "bf16",
                                                 "inference_precision": "bf16"}


def test_auto_is_replaced_everywhere_and_only_auto() -> None:
    tree = {"training": {"mixed_precision": "auto"}, "teacher": {"inference_precision": "auto",
            "training": {"mixed_precision": "fp16"}},
            "methods": {"kd": {"stages": {"task": {"mixed_precision": "auto"}}}},
            "name": "auto"}
    resolved = resolve_auto_precision(tree, {"mixed_precision": "no",
                                             "inference_precision": "fp32"})
    assert resolved == {"training": {"mixed_precision": "no"},
                        "teacher": {"inference_precision": "fp32",
                                    "training": {"mixed_precision": "fp16"}},
                        "methods": {"kd": {"stages": {"task": {"mixed_precision": "no"}}}},
                        "name": "auto"}


def test_a_resolved_auto_suite_is_the_explicit_suite(tiny_data_dir, tiny_teacher_dir,
                                                     tmp_path: Path) -> None:
    """So runs made with auto on an AVX2 CPU share ids with runs made with explicit fp32,
    and on a bf16 CPU with explicit bf16."""
    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)))
    auto = load_suite(str(suite_file), ["training.mixed_precision=auto",
                                        "teacher.inference_precision=auto",
                                        "methods.kd.stages.task.mixed_precision=auto"])
    for flags, expected in (({"avx2"}, ("no", "fp32")), ({"avx512_bf16"}, ("bf16", "bf16"))):
        explicit = load_suite(str(suite_file), [
            f"training.mixed_precision='{expected[0]}'",
            f"teacher.inference_precision={expected[1]}",
            f"methods.kd.stages.task.mixed_precision='{expected[0]}'"])
        resolved = with_resolved_precision(auto, auto_precision(CPU, flags))
        assert content_hash(resolved.model_dump()) == content_hash(explicit.model_dump())


def test_a_bare_no_in_a_recipe_or_set_is_the_setting_no(tiny_data_dir, tiny_teacher_dir,
                                                        tmp_path: Path) -> None:
    """YAML reads a bare `no` as false; `--set training.mixed_precision=no` means fp32."""
    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(tiny_data_dir, tiny_teacher_dir))
                          + "\n")
    suite = load_suite(str(suite_file), ["training.mixed_precision=no",
                                         "teacher.training.mixed_precision=no"])
    assert suite.training.mixed_precision == "no"
    assert suite.teacher.training.mixed_precision == "no"
    text = re.sub(r"(?m)^training:\n", "training:\n  mixed_precision: no\n",
                  suite_file.read_text())
    assert "  mixed_precision: no\n" in text
    suite_file.write_text(text)
    assert load_suite(str(suite_file)).training.mixed_precision == "no"


@pytest.mark.e2e
def test_a_record_made_where_auto_meant_fp32_is_the_recipes_run_where_it_means_bf16(
        tiny_data_dir, tiny_teacher_dir, tmp_path: Path) -> None:
    """The committed records were made where `auto` is fp32; on a CPU with native bf16 the
    same recipe has another run id, and the store's record of it is still its run: `run`
    skips it (the grid and the report find it the same way), while a recipe that names its
    precision has no other id."""
    from harness.experiments.runner import SuiteRunner

    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)))
    auto = load_suite(str(suite_file), ["training.mixed_precision=auto",
                                        "teacher.inference_precision=auto"])
    results, cache = tmp_path / "results", tmp_path / "cache"
    on_avx2 = SuiteRunner(auto, results, cache, log=lambda _: None, precision=FP32)
    messages: list[str] = []
    on_amx = SuiteRunner(auto, results, cache, log=messages.append, precision=BF16)
    fp32_id, bf16_id = on_avx2.planner.run_id("kd", "rte", 1), on_amx.planner.run_id("kd", "rte", 1)
    assert fp32_id != bf16_id
    for runner, other_id in ((on_avx2, bf16_id), (on_amx, fp32_id)):
        plan = runner.planner.resolve("kd", "rte", 1)
        assert runner.planner.equivalent_run_ids(plan) == [other_id]

    made = on_avx2.run_one("kd", "rte", 1)
    assert made.status == "finished" and made.record.run_id == fp32_id
    assert made.record.precisions == ["no"]
    found = on_amx.run_one("kd", "rte", 1)
    assert found.status == "skipped" and found.path == made.path
    assert found.main_score == made.main_score
    assert "trained in no" in messages[-1] and fp32_id[:16] in messages[-1]
    # `harness export` retrains it in the precision it was recorded in, on any machine.
    from harness.experiments.student_export import suite_for

    sets = ["training.mixed_precision=auto", "teacher.inference_precision=auto"]
    assert suite_for(made.record, [str(suite_file)], sets)[1] == FP32

    explicit = load_suite(str(suite_file), ["training.mixed_precision=bf16",
                                            "teacher.inference_precision=bf16"])
    pinned = SuiteRunner(explicit, results, cache, log=lambda _: None, precision=FP32)
    assert pinned.planner.equivalent_run_ids(pinned.planner.resolve("kd", "rte", 1)) == []
    assert pinned.planner.run_id("kd", "rte", 1) == bf16_id


@pytest.mark.e2e
@pytest.mark.parametrize("selection", ["last", "best-dev"])
def test_a_bf16_runs_recorded_dev_score_is_the_one_its_kept_checkpoint_was_scored(
        tiny_data_dir, tiny_teacher_dir, tmp_path: Path, selection: str) -> None:
    """A stage that trains in bf16 evaluates in fp32 and keeps its last or its best
    checkpoint by those scores; the record's dev scores are that checkpoint's, computed
    the same way (and so what an exported student loaded in fp32 gives)."""
    from harness.experiments.runner import SuiteRunner

    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)))
    suite = load_suite(str(suite_file), ["training.mixed_precision=bf16",
                                         f"selection={selection}"])
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    for task, metric in (("stsb", "pearson"), ("rte", "accuracy")):
        record = runner.run_one("finetune", task, seed=1).record
        assert record.config["stages"]["task"]["mixed_precision"] == "bf16"
        final = record.stages[-1]
        kept = final.best_metrics if selection == "best-dev" else final.evaluations[-1]
        assert record.dev["dev"][metric] == kept[metric]
        assert record.main_score == (max(e[metric] for e in final.evaluations)
                                     if selection == "best-dev" else kept[metric])

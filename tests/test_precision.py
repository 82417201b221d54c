"""``auto`` precision: chosen from the CPU's flags, resolved in a suite before any run id."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from harness.api.suites import load_suite
from harness.common.cache import content_hash
from harness.common.precision import auto_precision, cpu_flags, native_bf16, resolve_auto_precision
from harness.config.schema import with_resolved_precision
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

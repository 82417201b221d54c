"""``auto`` precision: bf16 where the hardware computes it natively, fp32 elsewhere.

bf16 autocast is a gain only with native bf16 arithmetic (a CPU with AVX512-BF16 or AMX, or
a CUDA device); elsewhere it is emulated (measurements: notes/2026-11-27-benchmarks-log.md,
"On a CPU with AMX" and "On an AMD CPU").  So ``auto`` reads the CPU's flags (or asks CUDA)
instead of assuming either.  A suite's ``auto`` values are resolved once per
process, before any run id is computed: the resolved precision is what a record's
configuration holds, so runs in different precisions never share an id.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags (as /proc/cpuinfo names them) that give native bf16 matrix arithmetic."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo does not exist)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16(device: torch.device, flags: set[str] | None = None) -> bool:
    """Whether ``device`` computes bf16 natively (CPU: AVX512-BF16 or AMX; CUDA: Ampere+).

    On CUDA, emulation does not count: ``torch.cuda.is_bf16_supported()`` also answers True
    on pre-Ampere GPUs (a V100, a T4), which compute bf16 through fp32 at no gain."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        found = cpu_flags() if flags is None else flags
        if found:
            return any(flag in found for flag in BF16_CPU_FLAGS)
        checks = [getattr(torch.cpu, name, None) for name in
                  ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return any(check() for check in checks if check is not None)
    return False


FP32 = {"mixed_precision": "no", "inference_precision": "fp32"}
BF16 = {"mixed_precision": "bf16", "inference_precision": "bf16"}
AUTO_RESOLUTIONS: tuple[dict[str, str], ...] = (FP32, BF16)
"""Every value :func:`auto_precision` can give: a recipe that says ``auto`` ran in one of
these, whichever machine made its record."""


def auto_precision(device: torch.device, flags: set[str] | None = None) -> dict[str, str]:
    """What ``auto`` resolves to on ``device``: the training autocast setting
    (``mixed_precision``) and the teacher's inference precision."""
    return dict(BF16 if native_bf16(device, flags) else FP32)


def resolve_auto_precision(tree: Any, resolved: dict[str, str]) -> Any:
    """``tree`` (a suite as plain data) with every ``mixed_precision: auto`` and
    ``inference_precision: auto`` replaced by ``resolved``'s value."""
    if isinstance(tree, dict):
        return {key: resolved[key] if key in resolved and value == "auto"
                else resolve_auto_precision(value, resolved)
                for key, value in tree.items()}
    if isinstance(tree, list):
        return [resolve_auto_precision(value, resolved) for value in tree]
    return tree


def to_float32(value: Any) -> Any:
    """``value`` with every floating tensor in it cast to float32: a tensor, or tensors inside
    tuples (named ones too), lists, dicts, transformers' ``ModelOutput`` and dataclasses, each
    rebuilt as its own type.  Casts keep the autograd graph; float32 tensors and everything
    else are passed through as they are, so fp32 runs see the very same objects."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() and \
            value.dtype != torch.float32 else value
    if isinstance(value, dict):  # ModelOutput is a dict and a dataclass: rebuilt by keyword
        converted = {key: to_float32(item) for key, item in value.items()}
        return value if all(converted[key] is value[key] for key in converted) \
            else type(value)(**converted)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {field.name: to_float32(getattr(value, field.name))
                   for field in dataclasses.fields(value) if field.init}
        return value if all(changes[name] is getattr(value, name) for name in changes) \
            else dataclasses.replace(value, **changes)
    if isinstance(value, tuple | list):
        items = [to_float32(item) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value

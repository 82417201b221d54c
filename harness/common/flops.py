"""Counting the floating-point operations of one forward pass."""

from __future__ import annotations

import torch
from torch import nn


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(model: nn.Module, inputs: dict[str, torch.Tensor]) -> int:
    """FLOPs of one forward (a multiply-add counts 2), by ``FlopCounterMode``."""
    from torch.utils.flop_counter import FlopCounterMode

    custom = {}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:
        custom[cpu_sdpa] = _sdpa_cpu_flops
    model.eval()
    with torch.inference_mode(), FlopCounterMode(display=False, custom_mapping=custom) as counter:
        model(**inputs)
    return int(counter.get_total_flops())

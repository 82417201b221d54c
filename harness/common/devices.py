"""Moving a batch of named tensors to a device (the engine's steps, the teacher's cached
outputs, the efficiency bench and the tests all move batches the same way)."""

from __future__ import annotations

import torch


def batch_to_device(batch: dict[str, torch.Tensor], device: torch.device
                    ) -> dict[str, torch.Tensor]:
    """``batch`` with every tensor on ``device``."""
    return {name: value.to(device) for name, value in batch.items()}

"""Keeping the processes of one `accelerate launch` (DDP) in step.

Every process of a distributed run executes the same command; anything decided by one
process (an Optuna trial's parameters, a pruning decision) must reach the others, or they
train different models in one DDP group.  Process 0 decides and broadcasts.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch.distributed as dist
from accelerate import Accelerator

T = TypeVar("T")


def broadcast(value: T, accelerator: Accelerator) -> T:
    """Process 0's ``value`` on every process (a no-op in a single process)."""
    if accelerator.num_processes == 1:
        return value
    objects: list[Any] = [value if accelerator.is_main_process else None]
    dist.broadcast_object_list(objects, src=0)
    return objects[0]


def gather(value: T, accelerator: Accelerator) -> list[T]:
    """Every process's ``value``, in process order (``[value]`` in a single process)."""
    if accelerator.num_processes == 1:
        return [value]
    gathered: list[Any] = [None] * accelerator.num_processes
    dist.all_gather_object(gathered, value)
    return gathered

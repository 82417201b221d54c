"""Keeping the processes of one `accelerate launch` (DDP) in step.

Every process of a distributed run executes the same command; anything decided by one
process (an Optuna trial's parameters, a pruning decision, whether a record or a cache
entry exists) must reach the others, or they train different models in one DDP group, or
one of them waits forever in a collective the others never enter.  Process 0 decides and
broadcasts.

Batches are split the way one process would see them: every process iterates the same
global batches (same sampler, same seed) and takes its own slice of each
(:func:`local_rows`), so a run has the same batches, steps, epochs and learning-rate
schedule on any number of processes, and a configuration means the same experiment.
"""

from __future__ import annotations

import atexit
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch import nn

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


def any_process(flag: bool, accelerator: Accelerator) -> bool:
    """True on every process when ``flag`` is true on any (e.g. a cache entry one node's
    cache lacks: building it may take every process, so all must agree to build)."""
    return any(gather(bool(flag), accelerator))


def local_rows(rows: list[int], accelerator: Accelerator) -> tuple[list[int], int]:
    """This process's share of the global batch ``rows`` and how many of them are its own.

    Process k takes the k-th of ``num_processes`` contiguous slices of ceil(len / n) rows.
    A batch with fewer rows than processes leaves some slice empty; such a process repeats
    the batch's first row (own rows: 0) so that it still takes part in the step (DDP needs
    every process in every forward and backward) and its result is weighted 0."""
    count = accelerator.num_processes
    if count == 1:
        return list(rows), len(rows)
    size = -(-len(rows) // count)
    share = list(rows[accelerator.process_index * size:(accelerator.process_index + 1) * size])
    if not share:
        return list(rows[:1]), 0
    return share, len(share)


def all_finite(finite: bool, accelerator: Accelerator) -> bool:
    """Whether ``finite`` holds on every process, the same answer on all (a collective
    with several processes): they stop together, or the others wait in the backward."""
    if accelerator.num_processes == 1:
        return finite
    return not bool(accelerator.reduce(torch.tensor(
        [0.0 if finite else 1.0], device=accelerator.device), "sum").item())


def weighted_by_share(loss: torch.Tensor, values: dict[str, torch.Tensor], own: int,
                      rows: int, accelerator: Accelerator
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``loss`` and its terms weighted by this process's share of the batch (``own`` of
    its ``rows``; unchanged in one process).  DDP averages the processes' gradients;
    weighting each by its share makes that the gradient of the whole batch's mean loss
    (and the logged mean over processes its value)."""
    if accelerator.num_processes == 1:
        return loss, values
    share = own * accelerator.num_processes / rows
    return loss * share, {name: value * share for name, value in values.items()}


def mean_over_processes(values: dict[str, float], accelerator: Accelerator
                        ) -> dict[str, float]:
    """The mean of each value over the processes, the same on all (``values`` itself in
    one process)."""
    if accelerator.num_processes == 1:
        return values
    names = list(values)
    reduced = accelerator.reduce(torch.tensor(
        [values[name] for name in names], device=accelerator.device), "mean")
    return dict(zip(names, reduced.tolist(), strict=True))


def average_gradients(parameters: list[nn.Parameter], accelerator: Accelerator) -> None:
    """Average ``parameters``' gradients over the processes (one collective), as DDP does
    for the modules it wraps.  A parameter without a gradient on every process keeps none
    (the optimiser skips it, as it would in one process)."""
    flat = torch.cat([p.grad.detach().reshape(-1) if p.grad is not None
                      else torch.zeros(p.numel(), device=p.device, dtype=p.dtype)
                      for p in parameters]
                     + [torch.tensor([float(p.grad is not None) for p in parameters],
                                     device=parameters[0].device, dtype=parameters[0].dtype)])
    flat = accelerator.reduce(flat, "sum")
    present = flat[-len(parameters):]
    offset = 0
    for parameter, count in zip(parameters, present.tolist(), strict=True):
        size = parameter.numel()
        if count:
            parameter.grad = (flat[offset:offset + size] / accelerator.num_processes
                              ).view_as(parameter).clone()
        offset += size


def release_at_exit(accelerator: Accelerator) -> None:
    """Destroy a multi-process run's process group when the interpreter exits.

    A process group left to the interpreter's own teardown is destroyed after Python has
    finalised, with its communication threads possibly still running: a process can then
    abort after its work is done ("terminate called without an active exception"), and
    `accelerate launch` reports the whole run as failed. Destroying it first, as
    ``Accelerator.end_training`` does, stops them in order (a no-op once it is gone)."""
    if accelerator.num_processes > 1:
        atexit.register(accelerator.state.destroy_process_group)

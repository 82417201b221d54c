"""A training stage's saved progress, in a file whose loading runs no code.

The file is one safetensors file.  Every tensor of the state (weights, the optimiser's
moments, random generator states, the losses of the current logging window) is a tensor
of the file, named by its place in the state (``optimizer/state/3/exp_avg``).  Everything
else (steps, the configuration, the schedule, the history) is JSON in the file's metadata
(``state``), where a tensor appears as ``{"tensor": name}``, a tuple as ``{"tuple": [...]}``
and a mapping as ``{"dict": [[key, value], ...]}`` (so that integer keys, such as the
optimiser's parameter numbers, stay integers).  The metadata also records the SHA-256 of
that JSON and of every tensor's name, dtype, shape and bytes (``sha256``).

Loading reads the file with safetensors (no unpickling), recomputes the checksum and
compares it before any of the state is used: a file cut short, altered, or of another
format (the pickles that older versions of the harness saved with ``torch.save``) raises
:class:`ProgressRefusedError`, whose message says why in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

FORMAT = "distill-bench stage progress 1"
_PICKLE_STARTS = (b"PK\x03\x04", b"\x80")
"""How the files ``torch.save`` writes begin: a zip archive (torch >= 1.6) or a pickle."""


class ProgressRefusedError(ValueError):
    """A saved progress file that is not used (the message says why, in one line)."""


def save_progress_file(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors, None, bools, numbers, strings, and lists, tuples and
    mappings of them) to ``path``: beside it first, flushed to disk, then renamed over
    it, so that a kill while saving leaves the previous file whole."""
    tensors: dict[str, torch.Tensor] = {}
    text = json.dumps(_encode(state, "", tensors, set()))
    metadata = {"format": FORMAT, "state": text, "sha256": _digest(text, tensors)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, partial, metadata=metadata)
        descriptor = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def load_progress_file(path: Path) -> dict[str, Any]:
    """The state :func:`save_progress_file` wrote to ``path``, its tensors on the CPU.
    Raises :class:`ProgressRefusedError` for a file that is not one, or not whole."""
    try:
        with safe_open(path, framework="pt") as stored:
            metadata = stored.metadata() or {}
            tensors = {name: stored.get_tensor(name)
                       for name in stored.keys()}  # noqa: SIM118 (no iterator of its own)
    except (OSError, SafetensorError) as error:
        if _pickled(path):
            raise ProgressRefusedError("saved progress in the older pickle format, which is "
                                       "never loaded") from error
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ProgressRefusedError(f"unreadable saved progress ({detail})") from error
    if metadata.get("format") != FORMAT:
        raise ProgressRefusedError(f"not saved progress of this harness (format "
                                   f"{str(metadata.get('format'))[:60]!r})")
    text = metadata.get("state")
    if not isinstance(text, str) or metadata.get("sha256") != _digest(text, tensors):
        raise ProgressRefusedError("saved progress damaged or altered (its checksum differs "
                                   "from the one saved with it)")
    try:
        state = _decode(json.loads(text), tensors, "")
    except ValueError as error:
        raise ProgressRefusedError(f"saved progress unreadable ({error})") from error
    if not isinstance(state, dict):
        raise ProgressRefusedError("saved progress unreadable (its state is not a mapping)")
    return state


def _pickled(path: Path) -> bool:
    """Whether ``path`` begins as the files ``torch.save`` writes do (asked only of a file
    that is not safetensors, whose first bytes are its header's length)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4).startswith(_PICKLE_STARTS)
    except OSError:
        return False


def _digest(text: str, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the state's JSON and of each tensor's name, dtype, shape and bytes."""
    digest = hashlib.sha256(text.encode())
    for name in sorted(tensors):
        tensor = tensors[name]
        digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _encode(value: Any, where: str, tensors: dict[str, torch.Tensor],
            storages: set[int]) -> Any:
    """``value`` as JSON, its tensors moved into ``tensors`` (on the CPU, contiguous, none
    sharing memory with another: safetensors stores each on its own)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        pointer = tensor.untyped_storage().data_ptr()
        if not tensor.is_contiguous() or (pointer and pointer in storages):
            tensor = tensor.contiguous().clone()
        storages.add(tensor.untyped_storage().data_ptr())
        name = where or "tensor"
        while name in tensors:
            name += "+"
        tensors[name] = tensor
        return {"tensor": name}
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        items = [_encode(item, f"{where}/{index}".lstrip("/"), tensors, storages)
                 for index, item in enumerate(value)]
        return items if isinstance(value, list) else {"tuple": items}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str | int):
                raise TypeError(f"saved progress: {where or 'the state'} has a key of type "
                                f"{type(key).__name__} ({key!r}); keys are strings or integers")
        return {"dict": [[key, _encode(item, f"{where}/{key}".lstrip("/"), tensors, storages)]
                         for key, item in value.items()]}
    raise TypeError(f"saved progress: {where or 'the state'} is a {type(value).__name__}, "
                    "which a progress file does not hold")


def _decode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """The value :func:`_encode` wrote as ``value``; ValueError for anything else."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_decode(item, tensors, f"{where}/{index}") for index, item in enumerate(value)]
    if isinstance(value, dict) and len(value) == 1:
        [(tag, body)] = value.items()
        if tag == "tensor" and isinstance(body, str) and body in tensors:
            return tensors[body]
        if tag == "tuple" and isinstance(body, list):
            return tuple(_decode(item, tensors, f"{where}/{index}")
                         for index, item in enumerate(body))
        if tag == "dict" and isinstance(body, list) and all(
                isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str | int)
                for pair in body):
            return {key: _decode(item, tensors, f"{where}/{key}") for key, item in body}
    raise ValueError(f"{where or 'the state'}: {json.dumps(value)[:60]} is not a value of "
                     "the format")

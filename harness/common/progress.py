"""Progress bars that suit both a terminal and a log file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from tqdm.auto import tqdm

_SILENT: ContextVar[bool] = ContextVar("harness_progress_silent", default=False)


def progress_bar(*args: Any, **kwargs: Any) -> tqdm:
    """A tqdm bar refreshed every second on a terminal and every 30 s into a log, so long
    jobs run under nohup show progress without writing a line per step; none is drawn
    inside :func:`silent_progress`."""
    kwargs.setdefault("mininterval", 1.0 if sys.stderr.isatty() else 30.0)
    kwargs.setdefault("dynamic_ncols", True)
    if _SILENT.get():
        kwargs["disable"] = True
    return tqdm(*args, **kwargs)


@contextmanager
def silent_progress(silent: bool = True) -> Iterator[None]:
    """No progress bar drawn by the code it wraps (in this thread or task): what a Python
    call with ``log=None`` asks for."""
    token = _SILENT.set(silent)
    try:
        yield
    finally:
        _SILENT.reset(token)

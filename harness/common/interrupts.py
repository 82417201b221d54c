"""Ctrl-C that is not lost.

Python turns SIGINT into a KeyboardInterrupt wherever the interpreter happens to be.  When
that is inside a callback the interpreter runs on its own (a weak reference's, an object's
finaliser), it prints "Exception ignored in ..." and carries on: the command goes on
training as if nothing was pressed.  Under ``accelerate launch`` it can happen to every
process of a run, which then finishes the run it was stopped in and records it.  While
:func:`catching_ctrl_c` is active, SIGINT also sets a flag, and the training loop calls
:func:`raise_if_interrupted` at every step: a Ctrl-C that was swallowed stops the command
at its next step, and the swallowed one is not printed (the command's own line says that
it was interrupted; "Exception ignored ... Traceback" above it would read as a crash)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class _Pressed:
    """Whether SIGINT arrived while :func:`catching_ctrl_c` was active (one per process:
    signals are the process's)."""

    value = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _Pressed.value = True
    raise KeyboardInterrupt


def _unraisable_unless_ctrl_c(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """``sys.unraisablehook`` that drops a KeyboardInterrupt raised by :func:`_on_sigint`
    inside a callback (the flag keeps it) and passes anything else to ``previous``."""

    def hook(unraisable: Any) -> object:
        if _Pressed.value and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return None
        return previous(unraisable)

    return hook


@contextmanager
def catching_ctrl_c() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt as usual and is remembered until the block ends
    (where SIGINT is Python's default handler and this is the main thread; elsewhere,
    e.g. under a test runner that installed its own, nothing changes).  One that Python
    swallows in a callback is not printed: the next :func:`raise_if_interrupted` raises it."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    _Pressed.value = False
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable_unless_ctrl_c(previous_hook)
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook
        _Pressed.value = False


def ctrl_c_pressed() -> bool:
    """Whether a Ctrl-C arrived in the active :func:`catching_ctrl_c` block."""
    return _Pressed.value


def raise_if_interrupted() -> None:
    """A KeyboardInterrupt if a Ctrl-C arrived and was swallowed (see the module's
    docstring); nothing otherwise."""
    if _Pressed.value:
        raise KeyboardInterrupt

"""Progress bars that suit both a terminal and a log file."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm


def progress_bar(*args: Any, **kwargs: Any) -> tqdm:
    """A tqdm bar refreshed every second on a terminal and every 30 s into a log, so long
    jobs run under nohup show progress without writing a line per step."""
    kwargs.setdefault("mininterval", 1.0 if sys.stderr.isatty() else 30.0)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(*args, **kwargs)

"""``python -m benchmarks``: every benchmark of the harness itself (``--help`` lists them)."""

from benchmarks.commands import app

app(prog_name="python -m benchmarks")

"""``python -m harness.cli``: the ``harness`` command line from a checkout."""

from harness.cli import app

app()

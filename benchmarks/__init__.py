"""The harness's own benchmarks, run from a checkout as ``python -m benchmarks <command>``
(docs/benchmarks.md).  They may import ``harness`` and ``methods``; neither imports them."""

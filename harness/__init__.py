"""distill-bench: a benchmark and ablation harness for knowledge distillation on GLUE."""

__version__ = "0.1.0"

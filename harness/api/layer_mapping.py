"""TinyBERT layer mapping: which teacher layer each student layer learns from.

Index convention of the paper (Jiao et al., 2020): 0 is the embedding layer, 1..M the
student's Transformer layers, 1..N the teacher's, M+1 / N+1 the prediction layer.  The
mapping g always has g(0) = 0 and g(M+1) = N+1; :func:`layer_map` gives g(m) for m = 1..M.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal

MappingStrategy = Literal["uniform", "top", "bottom"]
STRATEGIES: tuple[str, ...] = ("uniform", "top", "bottom")


def layer_map(num_student: int, num_teacher: int,
              strategy: MappingStrategy | Sequence[int] = "uniform") -> list[int]:
    """Teacher layer g(m) for each student Transformer layer m = 1..M (list index m - 1).

    * ``"uniform"``: g(m) = m * N / M, every (N/M)-th teacher layer; needs N divisible by M.
    * ``"top"``: g(m) = m + N - M, the last M teacher layers.
    * ``"bottom"``: g(m) = m, the first M teacher layers.
    * an explicit list of M strictly increasing teacher layers in 1..N.
    """
    _check_positive("num_student", num_student)
    _check_positive("num_teacher", num_teacher)
    if num_student > num_teacher:
        raise ValueError(f"a {num_student}-layer student cannot be mapped onto a "
                         f"{num_teacher}-layer teacher: each student layer needs its own "
                         "teacher layer")
    if isinstance(strategy, str):
        if strategy == "uniform":
            if num_teacher % num_student:
                raise ValueError(
                    f"uniform mapping needs the teacher depth N={num_teacher} to be a "
                    f"multiple of the student depth M={num_student}; give an explicit list "
                    f"of {num_student} teacher layers in 1..{num_teacher} instead")
            step = num_teacher // num_student
            return [m * step for m in range(1, num_student + 1)]
        if strategy == "top":
            return [m + num_teacher - num_student for m in range(1, num_student + 1)]
        if strategy == "bottom":
            return list(range(1, num_student + 1))
        raise ValueError(f"unknown layer mapping strategy {strategy!r}; use one of "
                         f"{', '.join(STRATEGIES)} or an explicit list of teacher layers")
    return _checked_explicit_map(list(strategy), num_student, num_teacher)


def _checked_explicit_map(layers: list[int], num_student: int, num_teacher: int) -> list[int]:
    if len(layers) != num_student:
        raise ValueError(f"explicit layer mapping {layers} has {len(layers)} entries; the "
                         f"student has {num_student} Transformer layers")
    if not all(isinstance(layer, int) and not isinstance(layer, bool) for layer in layers):
        raise ValueError(f"explicit layer mapping {layers} must hold integer layer numbers")
    out_of_range = [layer for layer in layers if not 1 <= layer <= num_teacher]
    if out_of_range:
        raise ValueError(f"explicit layer mapping {layers}: teacher layers {out_of_range} are "
                         f"outside 1..{num_teacher} (0 is the embeddings, mapped implicitly)")
    if any(later <= earlier for earlier, later in itertools.pairwise(layers)):
        raise ValueError(f"explicit layer mapping {layers} must be strictly increasing")
    return layers


def layer_weights(num_student: int,
                  weights: float | Sequence[float] | None = None) -> list[float]:
    """TinyBERT's lambda_m for m = 0..M+1 (list index m); the paper uses 1 for all.

    ``weights`` is None (all 1), one number for every layer, or M + 2 numbers: the
    embeddings, each Transformer layer, then the prediction layer.
    """
    _check_positive("num_student", num_student)
    count = num_student + 2
    if weights is None:
        values = [1.0] * count
    elif isinstance(weights, (int, float)):
        values = [float(weights)] * count
    else:
        values = [float(weight) for weight in weights]
        if len(values) != count:
            raise ValueError(f"{len(values)} layer weights given; a {num_student}-layer "
                             f"student needs {count} (embeddings, {num_student} Transformer "
                             "layers, prediction layer)")
    bad = [value for value in values if not math.isfinite(value) or value < 0]
    if bad:
        raise ValueError(f"layer weights must be finite and non-negative, got {bad}")
    return values


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")

"""What a training stage returns, and the error that stops a diverged one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class NonFiniteLossError(RuntimeError):
    """Training diverged; the run is stopped and recorded as failed."""

    def __init__(self, stage: str, step: int, values: dict[str, float], what: str = "loss"
                 ) -> None:
        super().__init__(f"non-finite {what} in stage {stage!r} at step {step}: "
                         f"{self.shown(values)}")
        self.stage = stage
        self.step = step
        self.values = values

    @staticmethod
    def shown(values: dict[str, float]) -> str:
        """``values`` as the message writes them: ``gold=nan, soft=1.234``."""
        return ", ".join(f"{name}={value:.4g}" for name, value in values.items())


@dataclass
class StageResult:
    name: str
    steps: int = 0
    examples_seen: int = 0
    seconds: float = 0.0
    best_metrics: dict[str, float] = field(default_factory=dict)
    best_step: int | None = None
    final_losses: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def examples_per_second(self) -> float:
        return self.examples_seen / self.seconds if self.seconds else 0.0

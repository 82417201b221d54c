"""The run record: what one run writes to the results store and what every reader reads.

One pydantic model, :class:`RunRecord`, is the record's schema. The runner builds it, the
store validates it before writing and again when reading (a record that does not validate
is an error naming its file, never a half-read dict), and the grid, tuning, reports, tables
and benchmarks read its attributes. Parts whose content belongs to another component (the
resolved config, the machine, inference speed, memory, general distillation, augmentation)
stay mappings: their writers own their keys. Unknown top-level keys are refused, so a
misspelt field is caught where it is written.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.common.cache import content_hash

Status = Literal["running", "finished", "failed"]
Number = float | int


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


PREDICTIONS_FILE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,150}\.predictions\.npz"
"""What a predictions file's name may be: one file name (no folder), so that a name read
from a record never leads elsewhere."""


class PredictionsSummary(_Part):
    """A per-example predictions file (:mod:`harness.experiments.predictions`): its name,
    its checksum and what it holds."""

    file: str = Field(pattern=rf"^{PREDICTIONS_FILE}$")
    """The file's name: a run's lies beside its record, a teacher's in the suite folder's
    ``teachers/``."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    kind: Literal["logits", "scores"]
    """Class logits (classification) or regression scores."""
    examples: dict[str, int]
    """Dev split -> the number of examples predicted."""


class SelectionSummary(_Part):
    """Which checkpoint the dev scores are of (the suite's ``selection``), and what the
    other choice would have given: the scores of the last checkpoint and of the best of the
    final stage's dev evaluations, kept whichever was chosen."""

    protocol: Literal["last", "best-dev"]
    stage: str
    """The stage whose evaluations these are (the last that evaluated)."""
    evaluations: int
    """How many times that stage looked at the dev set."""
    last_step: int
    last: dict[str, float]
    """The metrics at the stage's last evaluation (its last step)."""
    best_step: int
    best: dict[str, float]
    """The metrics of its best evaluation on the task's main metric."""
    gain: float
    """best minus last on the main metric, in points: what choosing the checkpoint on the
    dev set adds to the dev score (0 when the last evaluation was the best)."""

    @classmethod
    def of(cls, protocol: str, stage: str, evaluations: list[dict[str, Any]],
           main_metric: str) -> SelectionSummary | None:
        """From a stage's ``evaluations`` (``step``, ``epoch`` and the metrics of each, in
        order); the best is the first of the highest main scores, as the training loop
        keeps it.  None for a stage that never evaluated."""
        if not evaluations:
            return None

        def metrics(evaluation: dict[str, Any]) -> dict[str, float]:
            return {k: float(v) for k, v in evaluation.items() if k not in ("step", "epoch")}

        best = max(evaluations, key=lambda evaluation: evaluation[main_metric])
        last = evaluations[-1]
        return cls(protocol=protocol, stage=stage, evaluations=len(evaluations),
                   last_step=int(last["step"]), last=metrics(last),
                   best_step=int(best["step"]), best=metrics(best),
                   gain=float(best[main_metric]) - float(last[main_metric]))


class TeacherSummary(_Part):
    """The fine-tuned teacher the run distilled from (its cache key identifies it)."""

    checkpoint: str
    key: str
    inference_precision: str | None = None
    pooling: str | None = None
    dev: dict[str, dict[str, float]] = Field(default_factory=dict)
    """split -> metric -> score (x100), as measured by the teacher stage."""
    baseline: dict[str, float] = Field(default_factory=dict)
    """The majority-class (mean score for regression) dev baseline, per metric."""
    parameters: int | None = None
    training: dict[str, Any] | None = None
    """How it was fine-tuned (its resolved training settings; None: used as it is, or a
    record made before records held them)."""
    predictions: PredictionsSummary | None = None
    """Its dev predictions in the results store (None: a record made before they were
    kept)."""
    selection: SelectionSummary | None = None
    """Which of its fine-tuning's checkpoints it is (None: used as it is, or a record made
    before records said)."""


class DataSummary(_Part):
    """The task's data: files relative to the data folder, and their content fingerprint."""

    source: str
    fingerprint: str
    files: dict[str, str] = Field(default_factory=dict)
    layouts: dict[str, str] = Field(default_factory=dict)
    train_examples: int | None = None


class SeedSummary(_Part):
    run: int
    teacher: int
    subsample: int


class ParameterCount(_Part):
    total: int
    non_embedding: int


class StageSummary(_Part):
    """One training stage: its budget as run, its best evaluation and its loss history."""

    name: str
    steps: int
    examples_seen: int
    seconds: float
    examples_per_second: float
    best_step: int | None = None
    best_metrics: dict[str, float] | None = None
    terms: dict[str, float] | None = None
    """The loss terms the stage computed, with their weights: those it names that weigh
    more than 0 and apply to the task (None: a record made before records listed them)."""
    final_losses: dict[str, float] = Field(default_factory=dict)
    evaluations: list[dict[str, Number]] = Field(default_factory=list)
    """``step``, ``epoch`` and the dev metrics at each evaluation."""
    history: list[dict[str, Number]] = Field(default_factory=list)
    """``step``, ``epoch``, ``lr`` and each loss term, every ``log_every_steps``."""


class Failure(_Part):
    """Where a run stopped on a non-finite loss."""

    stage: str
    step: int | None = None
    losses: dict[str, float | None] = Field(default_factory=dict)


class RunRecord(_Part):
    """One run of one method on one task with one seed."""

    run_id: str
    """The content hash of ``config``: the same configuration is the same run."""
    status: Status
    suite: str
    method: str
    task: str
    task_display: str
    seed: int
    student_shape: str
    main_metric: str
    teacher: TeacherSummary
    data: DataSummary
    seeds: SeedSummary
    versions: dict[str, str]
    machine: dict[str, Any]
    config: dict[str, Any]
    """The resolved configuration the run id hashes."""
    config_hash: str
    started_at: str
    code: dict[str, Any] | None = None
    """The code that made it, outside the run id: ``plugins`` (name -> digest of each
    plugin the run executed) and ``core`` (the digest of the core's loss and metric code);
    see :mod:`harness.experiments.provenance`. A record whose code differs from the code now
    loaded is stale. ``attested`` (a commit) marks digests given to a record made before
    records named their code: those of that commit's code, which the code that ran it may
    differ from in ways that kept its run id. None: such a record without them."""

    # What put the run in the store, outside its id (annotations).
    variation: dict[str, Any] | None = None
    """How the run departed from the method's recipe (student, overrides, grid budget)."""
    grid: dict[str, Any] | None = None
    tuned: dict[str, Any] | None = None
    tuning: dict[str, Any] | None = None

    # Results of a finished run.
    dev: dict[str, dict[str, float]] | None = None
    main_score: float | None = None
    teacher_main_score: float | None = None
    pct_of_teacher: float | None = None
    """None where the teacher scores 0 (no meaningful ratio)."""
    parameters: ParameterCount | None = None
    inference: dict[str, Any] | None = None
    extra_parameters: int | None = None
    train_seconds: float | None = None
    train_examples_per_second: float | None = None
    final_losses: dict[str, float] | None = None
    stages: list[StageSummary] = Field(default_factory=list)
    general_distillation: dict[str, Any] | None = None
    augmentation: dict[str, Any] | None = None
    student_encoder: dict[str, Any] | None = None
    student_init: dict[str, Any] | None = None
    predictions: PredictionsSummary | None = None
    """The student's dev predictions, in a file beside the record, outside the run id
    (None: a failed run, or a record made before they were kept)."""
    selection: SelectionSummary | None = None
    """Which checkpoint ``dev`` scores, and the last and best-of-dev checkpoints' scores
    (None: no task stage evaluated, a failed run, or a record made before they were
    kept)."""

    # A failed run.
    error: str | None = None
    failure: Failure | None = None

    wall_seconds: float | None = None
    memory: dict[str, Any] | None = None
    finished_at: str | None = None

    @model_validator(mode="after")
    def _describes_its_configuration(self) -> RunRecord:
        """The run id is the hash of the resolved configuration, and the fields every
        reader groups by (suite, method, task, seed, student) say what the configuration
        says.  A record whose configuration was edited after the run (or copied under
        another run's name) would otherwise put its score in the row of a configuration
        that never produced it."""
        problems = []
        actual = content_hash(self.config)
        if self.run_id != actual:
            problems.append(f"its run id {self.run_id[:16]} is not the hash of its config "
                            f"({actual[:16]}): its config was edited, or the record copied under "
                            f"another run's id")
        if self.config_hash != self.run_id:
            problems.append(f"config_hash {self.config_hash[:16]} differs from its run id")
        said = {"suite": self.suite, "method": self.method, "task": self.task,
                "seed": self.seed, "student": self.student_shape}
        configured = {field: self.config.get(field) for field in said}
        if isinstance(configured["student"], dict):  # the shape, with its name
            configured["student"] = configured["student"].get("name")
        problems += [f"it says {field} {value!r}, its config {configured[field]!r}"
                     for field, value in said.items() if configured[field] != value]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def plugin(self) -> str:
        """The plugin that ran it (a variant's base), from its resolved config."""
        return str(self.config.get("plugin", self.method))

    @property
    def precisions(self) -> list[str]:
        """The autocast settings its stages trained in (``no``: fp32), from its config."""
        return sorted({str(stage.get("mixed_precision", "no"))
                       for stage in self.config.get("stages", {}).values()})

    @property
    def examples_seen(self) -> int:
        return sum(stage.examples_seen for stage in self.stages)

    @property
    def peak_rss_mb(self) -> float | None:
        return (self.memory or {}).get("peak_rss_mb")

    def label(self) -> str:
        """The table row of the run: its method, marked when the run departed from the
        method's recipe (tuned parameters, another student shape, a grid's budget), so such
        runs are never averaged with the recipe's own."""
        variation = self.variation or {}
        marks = []
        if variation.get("overrides") or self.tuned:
            marks.append("tuned")
        if variation.get("student"):
            marks.append(str(variation["student"]))
        if variation.get("task_epochs") is not None:
            marks.append("grid budget")
        return f"{self.method} [{', '.join(marks)}]" if marks else self.method

    def document(self) -> dict[str, Any]:
        """The JSON document the store writes: the fields the run set (an explicit None, such
        as the % of a teacher that scores 0, stays; a field no one set is left out)."""
        return self.model_dump(mode="json", exclude_unset=True)

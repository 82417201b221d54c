"""The nine GLUE tasks, specified once.

Label names follow the Hugging Face ``nyu-mll/glue`` order, which is the order every
teacher, student and data source in the harness must agree on (see
``harness.teacher.preparation.check_label_order``).  Main metrics follow the GLUE leaderboard:
the first metric listed in ``metrics`` is the one used for model selection and
"% of teacher".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    """Static description of one GLUE task."""

    name: str
    """Harness name, lower case (``sst2``)."""
    folder: str
    """Directory name in a GLUE-style data folder (``SST-2``)."""
    hub_config: str
    """Config name of the ``nyu-mll/glue`` hub dataset."""
    text_fields: tuple[str, ...]
    """Hugging Face field names of the input text(s): one for single-sentence tasks."""
    label_names: tuple[str, ...]
    """Class names in Hugging Face order; empty for regression."""
    metrics: tuple[str, ...]
    """Metric names reported for this task; ``metrics[0]`` is the main metric."""
    dev_splits: tuple[str, ...] = ("dev",)
    """Dev splits, kept apart (MNLI matched / mismatched); the first selects checkpoints."""
    test_splits: tuple[str, ...] = ("test",)
    hub_splits: tuple[tuple[str, str], ...] = (
        ("train", "train"),
        ("dev", "validation"),
        ("test", "test"),
    )
    """(harness split, hub split) pairs."""
    display_name: str = ""

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.label_names)

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    @property
    def selection_split(self) -> str:
        return self.dev_splits[0]


GLUE_TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            name="cola",
            folder="CoLA",
            hub_config="cola",
            text_fields=("sentence",),
            label_names=("unacceptable", "acceptable"),
            metrics=("matthews_correlation",),
            display_name="CoLA",
        ),
        TaskSpec(
            name="sst2",
            folder="SST-2",
            hub_config="sst2",
            text_fields=("sentence",),
            label_names=("negative", "positive"),
            metrics=("accuracy",),
            display_name="SST-2",
        ),
        TaskSpec(
            name="mrpc",
            folder="MRPC",
            hub_config="mrpc",
            text_fields=("sentence1", "sentence2"),
            label_names=("not_equivalent", "equivalent"),
            metrics=("f1", "accuracy"),
            display_name="MRPC",
        ),
        TaskSpec(
            name="qqp",
            folder="QQP",
            hub_config="qqp",
            text_fields=("question1", "question2"),
            label_names=("not_duplicate", "duplicate"),
            metrics=("f1", "accuracy"),
            display_name="QQP",
        ),
        TaskSpec(
            name="stsb",
            folder="STS-B",
            hub_config="stsb",
            text_fields=("sentence1", "sentence2"),
            label_names=(),
            metrics=("pearson", "spearmanr"),
            display_name="STS-B",
        ),
        TaskSpec(
            name="mnli",
            folder="MNLI",
            hub_config="mnli",
            text_fields=("premise", "hypothesis"),
            label_names=("entailment", "neutral", "contradiction"),
            metrics=("accuracy",),
            dev_splits=("dev_matched", "dev_mismatched"),
            test_splits=("test_matched", "test_mismatched"),
            hub_splits=(
                ("train", "train"),
                ("dev_matched", "validation_matched"),
                ("dev_mismatched", "validation_mismatched"),
                ("test_matched", "test_matched"),
                ("test_mismatched", "test_mismatched"),
            ),
            display_name="MNLI",
        ),
        TaskSpec(
            name="qnli",
            folder="QNLI",
            hub_config="qnli",
            text_fields=("question", "sentence"),
            label_names=("entailment", "not_entailment"),
            metrics=("accuracy",),
            display_name="QNLI",
        ),
        TaskSpec(
            name="rte",
            folder="RTE",
            hub_config="rte",
            text_fields=("sentence1", "sentence2"),
            label_names=("entailment", "not_entailment"),
            metrics=("accuracy",),
            display_name="RTE",
        ),
        TaskSpec(
            name="wnli",
            folder="WNLI",
            hub_config="wnli",
            text_fields=("sentence1", "sentence2"),
            label_names=("not_entailment", "entailment"),
            metrics=("accuracy",),
            display_name="WNLI",
        ),
    )
}

_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "cola-variant": "cola"}


class UnknownTaskError(KeyError, ValueError):
    """An unknown task name (a ValueError too, so recipe validation reports it in place)."""

    def __str__(self) -> str:
        return str(self.args[0])


def get_task(name: str) -> TaskSpec:
    """Look a task up by harness name, GLUE folder name or common alias."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in GLUE_TASKS:
        known = ", ".join(GLUE_TASKS)
        raise UnknownTaskError(f"unknown task {name!r}; known tasks: {known}")
    return GLUE_TASKS[key]

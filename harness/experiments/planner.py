"""Planning a run without training anything: the recipe with a grid cell's or a trial's
variation applied, the method built from it, every stage's budget, and the resolved
configuration whose hash is the run id, including the keys of the teacher and of the
general checkpoint the run reads.  :class:`harness.experiments.runner.SuiteRunner` executes
the plans; the grid and tuning ask the planner for ids before they decide what to run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import PretrainedConfig

from harness.api.architectures import dimensions
from harness.api.compatibility import check_method_architecture
from harness.api.context import StudentKindConfig
from harness.api.method import Method, Stage
from harness.api.registry import (
    instantiate,
    plugin_file,
    typed_student_shape,
    undeclared_stage_terms,
)
from harness.api.students import resolve_teacher_sizes, student_pooling, teacher_fit_problem
from harness.api.suites import load_suite
from harness.assets.checkpoints import (
    AssetNotFoundError,
    Checkpoint,
    load_base_config,
    load_tokenizer,
    resolve_checkpoint,
)
from harness.common.cache import content_hash
from harness.common.precision import AUTO_RESOLUTIONS, auto_precision
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
from harness.experiments.provenance import code_change, run_code
from harness.experiments.record import RECORD_VERSION, RunRecord
from harness.teacher.finetune import teacher_key, teacher_pooling
from harness.teacher.outputs import intermediate_cache_spec

GENERAL_VERSION = 1


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


class RunPlanner:
    """Resolves runs of one suite on one device (``auto`` precisions are resolved for it
    before any key or run id is computed).  Reads and encodes task data and the corpus, for
    their fingerprints; trains nothing."""

    def __init__(self, suite: SuiteConfig, device: torch.device,
                 log: Callable[[str], None] = print,
                 precision: dict[str, str] | None = None, encode: bool = True) -> None:
        """``precision``: what ``auto`` resolves to (default: what ``device`` computes
        natively).  ``encode=False`` plans run ids only: a task's data is read for its
        fingerprint and not tokenized, which is most of what planning costs."""
        self.declared_suite = suite
        self.device = device
        self.precision = precision or auto_precision(device)
        self.suite = with_resolved_precision(suite, self.precision)
        self._other_precisions: list[RunPlanner] | None = None
        self.log = log
        self.encode = encode
        self.checkpoint: Checkpoint = resolve_checkpoint(suite.teacher.checkpoint)
        self._tokenizer = None
        self._tasks: dict[str, PreparedTask] = {}
        self._corpus: Corpus | None = None
        self._corpus_from: RunPlanner | None = None
        self._teacher_pooling: str | None = None
        self._teacher_config: PretrainedConfig | None = None

    # -- preparation ---------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.checkpoint)
        return self._tokenizer

    def prepare_task(self, name: str) -> PreparedTask:
        """The task's training and dev splits, read and (unless ``encode=False``) encoded
        once per planner.  Its test splits are hashed into the data fingerprint and not
        read: nothing in a run uses them (their gold labels are hidden)."""
        if name not in self._tasks:
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
            self._tasks[name] = PreparedTask(task, data, splits, max_length)
        return self._tasks[name]

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

    def resolve(self, method_name: str, task_name: str, seed: int,
                variation: Variation = Variation()
                ) -> tuple[Method, dict[str, Any], dict[str, TrainConfig]]:
        """The method and the fully resolved configuration of one run (hashed for the id)."""
        task = get_task(task_name)
        recipe = self.recipe(method_name, task.name, variation)
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
        stage_names = {stage.name for stage in stages}
        named = [(f"stages.{name}", name) for name in recipe.stages]
        named += [(f"task_stages.{task.name}.{name}", name)
                  for name in recipe.task_stages.get(task.name, {})]
        known = set(method.stage_names or stage_names)
        for where, stage_name in named:
            if stage_name not in known:
                raise ConfigError(f"methods.{method_name}.{where}: {plugin} has no stage "
                                  f"{stage_name!r}; its stages are {sorted(known)}")
        general = [stage for stage in stages if stage.is_general]
        if stages[:len(general)] != general:
            raise ValueError(f"{method_name}: corpus (general) stages must come first")
        stage_configs = {
            stage.name: self.suite.train_config(
                None if stage.is_general else task.name,
                *recipe.stage_overrides(None if stage.is_general else task.name, stage.name))
            for stage in stages}
        if variation.task_epochs is not None:
            try:
                stage_configs = scale_to_budget(stages, stage_configs, variation.task_epochs)
            except ConfigError as error:
                raise ConfigError(
                    f"methods.{method_name} on {task.name}: {error} (grid.budget.task_epochs): "
                    "give the stage `epochs` instead of `max_steps` (in training, "
                    "task_training or the method's stages), or list the method in "
                    "grid.budget.own_budget to keep its recipe's budget") from None
        prepared = self.prepare_task(task_name)
        shape_name = self.suite.student_name(recipe)
        shape = self.student_shape(shape_name)
        if student_kind(shape) not in method.student_kinds:
            raise ConfigError(f"methods.{method_name}: student {shape_name!r} is of kind "
                              f"{student_kind(shape)!r}; {plugin} builds "
                              f"{' or '.join(method.student_kinds)} students")
        # A method that cannot work with the teacher's architecture stops here, before any
        # data, teacher or student is touched.
        check_method_architecture(method_name, method, stages, self.teacher_config,
                                  student_kind(shape))
        check_method_assets(method_name, method, shape_name, shape)
        check_method_student(method_name, method, shape_name, shape, self.teacher_config)
        spec = {
            "record_version": RECORD_VERSION,
            "suite": self.suite.record_suite,
            "task": task.name,
            "method": method_name,
            "seed": seed,
            # best-dev, the protocol of the first records, is the spec without it
            **({"selection": self.suite.selection}
               if self.suite.selection != "best-dev" else {}),
            "student": {"name": shape_name,
                        **(shape.run_identity() if isinstance(shape, StudentKindConfig)
                           else shape.model_dump()),
                        **({"pooling": pooling} if (pooling := self.student_pooling(shape_name))
                           else {})},
            **({"plugin": plugin} if plugin != method_name else {}),
            "params": method.params.model_dump(),
            **({"method_key": method_key} if (method_key := method.run_key()) else {}),
            "loss_weights": {term: weight for term, weight in method.weights.items()
                             if term not in method.inactive_terms(task)},
            "stages": {name: config.identity() for name, config in stage_configs.items()},
            "teacher": {"checkpoint": self.checkpoint.name, "key": self.teacher_key(prepared)},
            "data": {  # content, not location: the same data hashes alike anywhere
                "source": self.suite.data.source,
                "fingerprint": prepared.data.fingerprint,
                "max_train_examples": self.suite.data.max_train_examples.get(task.name),
                "subsample_seed": self.suite.data.subsample_seed,
                "max_seq_length": prepared.max_length,
            },
        }
        if general:
            if recipe.init_from is not None:
                raise ConfigError(f"methods.{method_name}.init_from: {plugin} runs general "
                                  "stages of its own; init_from is for methods without them")
            spec["general"] = {"key": self.general_key(method, shape, general, stage_configs)}
        elif recipe.init_from is not None:
            source, source_stages, source_configs = self.general_source(
                recipe.init_from, task, shape_name, where=f"methods.{method_name}.init_from")
            spec["general"] = {"key": self.general_key(source, shape, source_stages,
                                                       source_configs),
                               "from": recipe.init_from}
        if method.reads_corpus():  # e.g. an augmenter's masked-LM head fitted on it
            spec["corpus"] = {"sentences": sentences_fingerprint(self.corpus().sentences)}
        spec["teacher"].update(intermediate_cache_spec(self.suite.teacher, method, stages))
        return method, spec, stage_configs

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
        return content_hash(self.resolve(method_name, task_name, seed, variation)[1])

    def run_code(self, method_name: str) -> dict[str, Any]:
        """The code a run of ``method_name`` executes (:func:`~harness.experiments.provenance.
        run_code`): its plugin's, that of the method whose general checkpoint it starts from
        (``init_from``), and the core's loss and metric code."""
        recipe = self.suite.recipe(method_name)
        plugins = [self.suite.plugin(method_name)]
        if recipe.init_from is not None:
            plugins.append(self.suite.plugin(recipe.init_from))
        return run_code(plugins)

    def overrides_are_the_recipes(self, method_name: str, task_name: str, seed: int,
                                  variation: Variation, run_id: str | None = None) -> bool:
        """Whether ``variation``'s overrides leave the run as it is without them (the
        same run id: tuned parameters that are the recipe's own values).  ``run_id``: the
        run's id with them, when the caller has it."""
        if not variation.overrides:
            return False
        if run_id is None:
            run_id = self.run_id(method_name, task_name, seed, variation)
        try:
            without = self.run_id(method_name, task_name, seed,
                                  replace(variation, overrides=()))
        except (ValueError, AssetNotFoundError):  # the recipe alone cannot run here:
            return False  # the overrides are what makes the run possible
        return run_id == without

    def equivalent_run_ids(self, method_name: str, task_name: str, seed: int,
                           variation: Variation = Variation()) -> list[str]:
        """The ids this run has where the recipe's ``auto`` precisions resolve otherwise.

        A run's id hashes the precision it trains in, so a record made on a machine without
        native bf16 (``auto`` -> fp32) has another id than the same recipe run where bf16 is
        native.  Both are records of the recipe as written: a store that holds either has
        the run, and the record says which precision it ran in.  Empty when the recipe has
        no ``auto`` precision."""
        if self._other_precisions is None:
            self._other_precisions = []
            for resolution in AUTO_RESOLUTIONS:
                if resolution == self.precision:
                    continue
                other = RunPlanner(self.declared_suite, self.device, self.log, resolution,
                                   encode=self.encode)
                if other.suite == self.suite:  # nothing in the recipe says auto
                    continue
                other._tasks = self._tasks  # the same data, prepared once
                self._other_precisions.append(other)
        ids = []
        for other in self._other_precisions:
            other._tokenizer = self._tokenizer
            other._corpus = other._corpus or self._corpus
            ids.append(other.run_id(method_name, task_name, seed, variation))
            self._corpus = self._corpus or other._corpus
            self._tokenizer = self._tokenizer or other._tokenizer
        return ids

    # -- general distillation ------------------------------------------------------------
    def corpus(self) -> Corpus:
        """The suite's unlabeled corpus (built once per process)."""
        if self._corpus is None and self._corpus_from is not None:
            self._corpus = self._corpus_from.corpus()
        if self._corpus is None:
            self.check_lengths(corpus=True)
            config = self.suite.corpus
            names = self._corpus_tasks()
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
            self._corpus = build_corpus(config, tasks, data_dir)
        return self._corpus

    def _corpus_tasks(self) -> list[str]:
        """The tasks whose training sentences the corpus reads."""
        config = self.suite.corpus
        return list(config.tasks or self.suite.tasks) if config.task_sentences else []

    def share_reading(self, other: RunPlanner) -> None:
        """Take task data, and the corpus, from ``other`` where it reads the same: the same
        data settings, teacher (its tokenizer) and encoding; for the corpus also the same
        corpus settings and tasks.  Planners of two suites of one store (a view such as
        tinybert-ablation and its protocol) then read and fingerprint each once."""
        if (self.suite.data, self.suite.teacher.checkpoint, self.encode) != (
                other.suite.data, other.suite.teacher.checkpoint, other.encode):
            return
        self._tasks = other._tasks
        if (self.suite.corpus, self._corpus_tasks()) == (other.suite.corpus,
                                                          other._corpus_tasks()):
            self._corpus_from = other

    def general_key(self, method: Method, shape: StudentConfig, stages: list[Stage],
                    stage_configs: dict[str, TrainConfig]) -> str:
        corpus = self.corpus()
        return content_hash({
            "kind": "general", "version": GENERAL_VERSION, "method": method.name,
            "method_key": method.general_key(),
            "student": {**shape.model_dump(),
                        "pooling": student_pooling(shape, self.teacher_pooling)},
            "teacher": self.checkpoint.identity,
            "corpus": {"fingerprint": corpus.fingerprint,
                       "max_seq_length": self.suite.corpus.max_seq_length,
                       "long_lines": self.suite.corpus.long_lines,
                       "seed": self.suite.corpus.seed,
                       **({"pairs": True} if self.suite.corpus.pairs else {})},
            "stages": {stage.name: stage_configs[stage.name].identity() for stage in stages},
        })


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
                ids = {planner.run_id(record.method, record.task, record.seed, variation),
                       *planner.equivalent_run_ids(record.method, record.task, record.seed,
                                                   variation)}
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

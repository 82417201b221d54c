"""Loading a suite with every recipe checked against the plugins it names, before anything
runs: student shapes against their kind's schema, each method recipe and variant (its
plugin, params, per-task params, loss terms, stage names, student kind), the grid's
methods and ``default_method``.  An error names the suite file and the key path where the
mistake was written: a variant's own key, not its base's."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from harness.api.registry import (
    instantiate,
    registry,
    student_shape_problems,
    weighted_method,
)
from harness.common.paths import name_problem
from harness.config.schema import (
    ConfigError,
    MethodRecipe,
    SuiteConfig,
    SuiteSource,
    has_key_path,
    parse_assignment,
    read_suite,
    suite_source,
)
from harness.data.tasks import get_task

MAX_PROBLEMS = 12
"""Problems listed in one error; the count of the rest follows them."""


def load_suite(name_or_path: str, overrides: list[str] | None = None) -> SuiteConfig:
    """Read and validate a suite recipe (``--set`` overrides applied), then check every
    recipe in it against its plugin."""
    suite, source = read_suite(name_or_path, overrides)
    problems = suite_problems(suite)
    if problems:
        raise ConfigError(format_problems(str(source.path),
                                          [_with_origin(line, source) for line in problems]))
    return suite


def _with_origin(problem: str, source: SuiteSource) -> str:
    """``key.path: what is wrong``, followed by where that key was written when it was not
    the suite's own file (a ``--set`` assignment, a suite it extends)."""
    key_path = problem.split(":", 1)[0]
    return f"{problem}{source.origin(key_path)}" if " " not in key_path else problem


def format_problems(source: str, problems: list[str]) -> str:
    shown = problems[:MAX_PROBLEMS]
    more = len(problems) - len(shown)
    return "\n".join([f"{source}: invalid recipe", *(f"  {line}" for line in shown),
                      *([f"  ... and {more} more"] if more else [])])


def suite_problems(suite: SuiteConfig) -> list[str]:
    """Every mistake in the suite's students, method recipes, grid and default method, as
    ``key.path: what is wrong`` lines (empty: none)."""
    problems: list[str] = []
    for name, shape in suite.students.items():
        problems.extend(student_shape_problems(name, shape))
    for name in suite.methods:
        problems.extend(_recipe_problems(suite, name))
    problems.extend(unknown_methods(suite, suite.default_methods(), "default_method"))
    if suite.grid is not None:
        problems.extend(unknown_methods(suite, suite.grid.methods, "grid.methods"))
    # A base's mistake shows again through each variant's merged params: list it once.
    return list(dict.fromkeys(problems))


def unknown_methods(suite: SuiteConfig, names: Iterable[str], where: str) -> list[str]:
    """Names that are neither a recipe of the suite nor a registered plugin, each with the
    closest known names; a name that could not name a folder of the store says so."""
    known = [*suite.methods, *(name for name in registry.names() if name not in suite.methods)]
    return [f"{where}: {name_problem(name)}" if name_problem(name) else
            f"{where}: unknown method {name!r}; {_closest(name, known)}"
            for name in names if name not in known and name != "all"]


def _closest(name: str, known: list[str]) -> str:
    """A hint for a misspelt method: the closest known names, else the plugins."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(map(repr, close))}?"
    return f"plugins: {', '.join(registry.names())}"


def check_method_names(suite: SuiteConfig, names: Iterable[str], where: str,
                       source: str | None = None) -> None:
    """Raise a short error for ``names`` (e.g. ``--method``) the suite cannot run;
    ``source``: the suite's file, named in the error."""
    problems = unknown_methods(suite, names, where)
    if problems:
        raise ConfigError(f"{source or f'suite {suite.name}'}: {problems[0]}")


def _recipe_problems(suite: SuiteConfig, name: str) -> list[str]:
    own = suite.methods[name]
    where = f"methods.{name}"
    plugin_name = suite.plugin(name)
    try:
        cls = registry.get(plugin_name)
    except KeyError:
        key = f"{where}.base" if own.base is not None else where
        return [f"{key}: unknown method {plugin_name!r}; "
                f"{_closest(plugin_name, registry.names())}"]
    problems: list[str] = []
    terms = {term.name for term in cls.loss_terms}
    for key, term in [*((f"loss_weights.{term}", term) for term in own.loss_weights),
                      *((f"disabled_losses.{index}", term)
                        for index, term in enumerate(own.disabled_losses))]:
        if term not in terms:
            problems.append(f"{where}.{key}: {plugin_name} has no loss term {term!r}; its "
                            f"terms: {', '.join(sorted(terms))}")
    merged = suite.recipe(name)
    base = suite.methods.get(own.base) if own.base is not None else None
    tasks = [get_task(task) for task in suite.tasks]
    stage_names: set[str] = set()
    for task in [None, *tasks]:
        task_name = task.name if task is not None else None
        try:
            params = cls.Params.model_validate(merged.params_for(task_name))
        except ValidationError as error:
            for item in error.errors():
                problem = ("unknown parameter" if item["type"] == "extra_forbidden"
                           else item["msg"])
                key = _params_key(name, own, own.base, base, task_name, item["loc"])
                problems.append(f"{key}: {problem}")
            continue
        if task is None:
            continue
        method = weighted_method(cls, params, merged)
        try:
            stage_names |= {stage.name for stage in method.stages(task)}
        except (ValueError, ConfigError) as error:
            problems.append(f"{where}: {error}")
        stage_names |= set(method.stage_names or ())
    problems = list(dict.fromkeys(problems))  # a bad key shows again for every task
    if stage_names:
        written = [(f"stages.{stage}", stage) for stage in own.stages]
        written += [(f"task_stages.{task}.{stage}", stage)
                    for task, stages in own.task_stages.items() for stage in stages]
        problems += [f"{where}.{key}: {plugin_name} has no stage {stage!r}; its stages: "
                     f"{', '.join(sorted(stage_names))}"
                     for key, stage in written if stage not in stage_names]
    if own.student is not None:
        kind = _kind(suite, own.student)
        if kind is not None and kind not in cls.student_kinds:
            problems.append(f"{where}.student: {own.student!r} is a {kind} student; "
                            f"{plugin_name} builds {' or '.join(cls.student_kinds)} students")
    elif base is None:  # a variant of a recipe in the suite: that recipe's check covers it
        kind = _kind(suite, suite.default_student)
        if kind is not None and kind not in cls.student_kinds:
            problems.append(f"{where}: the suite's default_student {suite.default_student!r} "
                            f"is a {kind} student; {plugin_name} builds "
                            f"{' or '.join(cls.student_kinds)} students (set student:)")
    return problems


def _kind(suite: SuiteConfig, shape_name: str) -> str | None:
    """The shape's kind; None for a kind no plugin defines (reported with the shape)."""
    kind = getattr(suite.students[shape_name], "kind", "bert")
    return kind if kind == "bert" or kind in registry.student_kinds() else None


def _params_key(name: str, own: MethodRecipe, base_name: str | None,
                base: MethodRecipe | None, task: str | None, loc: tuple[Any, ...]) -> str:
    """Where the parameter at ``loc`` was written: the variant's own params (or its
    task_params for ``task``) when it sets the key, else its base's; a missing value or a
    wrong type that nobody set is the variant's (its merged params)."""
    path = ".".join(str(part) for part in loc)
    candidates = [(f"methods.{name}", own)]
    if base is not None:
        candidates.append((f"methods.{base_name}", base))
    for prefix, recipe in candidates:
        if task is not None and has_key_path(recipe.task_params.get(task, {}), loc):
            return f"{prefix}.task_params.{task}.{path}"
        if has_key_path(recipe.params, loc):
            return f"{prefix}.params.{path}"
    return f"methods.{name}.params.{path}"


SHADOWED_ROOTS = ("training", "task_training", "methods")
"""Where a ``--set`` can be outranked by a more specific value: the suite's budgets (by a
method's stages) and a recipe (by a variant's own keys, or a method not being run)."""


def unused_assignments(name_or_path: str, overrides: list[str], suite: SuiteConfig,
                       methods: Iterable[str], tasks: Iterable[str]) -> list[str]:
    """The ``--set`` assignments of budgets or recipes that change nothing these runs train
    with, each as a line that says what they keep.  Such an assignment is valid, so it is
    no error, but its runs are those of the recipe without it (the same run ids: a store
    that has them skips them), which is not what whoever wrote it meant; the usual cause
    is a method's own ``stages.<stage>.<field>`` outranking ``training.<field>``."""
    cells = [(method, task) for method in methods for task in tasks]
    views: dict[tuple[str, str], dict[str, Any]] = {}
    source: SuiteSource | None = None
    lines = []
    for index, assignment in enumerate(overrides):
        key_path, _ = parse_assignment(assignment)
        if tuple(key_path[:2]) in PER_TASK_ROOTS and len(key_path) > 2:
            if not _reaches(suite, key_path[:2], key_path[2], cells):
                lines.append(f"--set {assignment.strip()} changes none of these runs: they "
                             f"do not include task {key_path[2]}" + (
                                 "" if key_path[0] == "teacher" else
                                 " (nor a general distillation on its sentences)"))
            continue
        if key_path[0] not in SHADOWED_ROOTS:
            continue
        if source is None:  # the suite's files, read once for every assignment
            source = suite_source(name_or_path)
        try:
            without, _ = source.apply(overrides[:index] + overrides[index + 1:])
        except ConfigError:  # another assignment needs this one: it has an effect
            continue
        if not views:  # the runs as asked for, read once for every assignment
            views = {cell: _training_view(suite, *cell) for cell in cells}
        if any(views[cell] != _training_view(without, *cell) for cell in cells):
            continue
        line = f"--set {assignment.strip()} changes none of these runs"
        if key_path[0] in ("training", "task_training"):
            field = key_path[-1]
            kept = sorted({f"{method} {stage}: {field}={values.get(field)}"
                           for (method, _), view in views.items()
                           for stage, values in view["stages"].items()})
            line += (f"; their stages keep {', '.join(kept[:4])}"
                     f"{' ...' if len(kept) > 4 else ''} (a method's stages and task_stages "
                     "outrank the suite's training and task_training)")
        lines.append(line)
    return lines


PER_TASK_ROOTS = {("data", "max_train_examples"), ("teacher", "task_training")}
"""Per-task settings outside the recipes: they reach only runs on their task (a teacher is
one task's), and a task's training-set cap also reaches the general distillation whose
corpus holds that task's sentences."""


def _reaches(suite: SuiteConfig, root: list[str], task_key: str,
             cells: list[tuple[str, str]]) -> bool:
    """Whether a per-task setting of ``task_key`` under ``root`` reaches any of ``cells``."""
    try:
        task = get_task(task_key).name
    except KeyError:  # not a task: validation names it
        return True
    if any(get_task(cell_task).name == task for _, cell_task in cells):  # `STS-B` is stsb
        return True
    corpus = suite.corpus
    if root[0] == "teacher" or not corpus.task_sentences or \
            task not in (corpus.tasks or suite.tasks):
        return False
    return any(_distils_on_corpus(suite, method, cell_task) for method, cell_task in cells)


def _distils_on_corpus(suite: SuiteConfig, method_name: str, task_name: str) -> bool:
    """Whether the run trains a general stage or starts from one (``init_from``)."""
    recipe = suite.recipe(method_name)
    if recipe.init_from is not None:
        return True
    method = instantiate(suite.plugin(method_name), recipe, task_name)
    return any(stage.is_general for stage in method.stages(get_task(task_name)))


def _training_view(suite: SuiteConfig, method_name: str, task_name: str) -> dict[str, Any]:
    """What a run of ``method_name`` on ``task_name`` trains with, from the recipe alone:
    its parameters, loss weights, student and every stage's budget, and those of the
    method whose general checkpoint it starts from (``init_from``)."""
    recipe = suite.recipe(method_name)
    method = instantiate(suite.plugin(method_name), recipe, task_name)
    task = get_task(task_name)
    stages = {}
    for stage in method.stages(task):
        scope = None if stage.is_general else task.name
        stages[stage.name] = suite.train_config(
            scope, *recipe.stage_overrides(scope, stage.name)).model_dump()
    view = {"params": method.params.model_dump(), "weights": method.weights,
            "student": recipe.student, "stages": stages}
    if recipe.init_from is not None:
        view["init_from"] = _training_view(suite, recipe.init_from, task_name)
    return view

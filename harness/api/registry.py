"""The method registry: built-in plugins from ``methods/`` and third-party ones from the
``harness.methods`` entry-point group, found by name; and building a method from its recipe."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types
import typing
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path

from pydantic import ValidationError

from harness.api.context import Augmenter, StudentKindConfig, augmenter_problem
from harness.api.method import Method, MethodParams, Stage
from harness.common.cli_options import error_text
from harness.config.schema import ConfigError, MethodRecipe, PluginStudentShape, StudentConfig

ENTRY_POINT_GROUP = "harness.methods"


class MethodRegistry:
    """Name -> Method class; built-ins from ``methods/``, others from entry points."""

    def __init__(self) -> None:
        self._methods: dict[str, type[Method]] = {}
        self._student_kinds: dict[str, tuple[type[StudentKindConfig], str]] = {}
        self._discovered = False
        self.broken: list[str] = []
        """Plugins that could not be loaded, each with its file and why."""

    def register(self, cls: type[Method]) -> type[Method]:
        name = getattr(cls, "name", None)
        if not name:
            raise TypeError(f"{cls.__qualname__} must set a class attribute 'name'")
        existing = self._methods.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"method {name!r} registered twice ({existing} and {cls})")
        for term in cls.loss_terms:
            if not callable(getattr(cls, f"loss_{term.name}", None)):
                raise TypeError(f"{cls.__qualname__}: loss term {term.name!r} has no "
                                f"loss_{term.name} method")
        for augmenter in declared_augmenters(cls):
            if (problem := augmenter_problem(augmenter)) is not None:
                raise TypeError(f"{plugin_file(cls)}: {cls.__qualname__}.augmenter(): "
                                f"{problem}")
        for kind, schema in cls.student_shapes.items():
            if kind == "bert":
                raise TypeError(f"{cls.__qualname__}: student kind 'bert' is the core's")
            if not (isinstance(schema, type) and issubclass(schema, StudentKindConfig)):
                raise TypeError(f"{cls.__qualname__}: student kind {kind!r} needs a "
                                "StudentKindConfig subclass as its schema")
            known = self._student_kinds.get(kind)
            if known is not None and known[0] is not schema:
                raise ValueError(f"student kind {kind!r} defined twice (by {known[1]} and "
                                 f"{name})")
            self._student_kinds[kind] = (schema, name)
        self._methods[name] = cls
        return cls

    def discover(self) -> None:
        """Import every plugin.  One that cannot be loaded (a syntax error, a loss term
        without its method, a name taken) is named on stderr with its file and left out,
        so the other methods stay usable; asking for a method it would have defined names
        it again (:meth:`get`)."""
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module("methods")  # by name: the core imports no method
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                where = str(Path(module.module_finder.path) / module.name)  # type: ignore[union-attr]
                where += "/" if module.ispkg else ".py"
                self._load(where, lambda name=module.name: importlib.import_module(
                    f"methods.{name}"))
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            self._load(f"entry point {entry.name} ({entry.value})",
                       lambda entry=entry: self._register_entry(entry.load()))

    def _register_entry(self, loaded: object) -> None:
        if isinstance(loaded, type) and issubclass(loaded, Method):
            self.register(loaded)

    def _load(self, where: str, load: Callable[[], object]) -> None:
        try:
            load()
        except Exception as error:  # a plugin's own fault, whatever it is
            problem = f"{where}: not loaded ({_error_line(error)})"
            self.broken.append(problem)
            print(f"WARNING: method plugin {problem}", file=sys.stderr, flush=True)

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._methods)

    def get(self, name: str) -> type[Method]:
        self.discover()
        if name not in self._methods:
            known = ", ".join(self.names())
            broken = "".join(f"; {problem}" for problem in self.broken)
            raise KeyError(f"unknown method {name!r}; registered methods: {known}{broken}")
        return self._methods[name]

    def items(self) -> Iterable[tuple[str, type[Method]]]:
        self.discover()
        return sorted(self._methods.items())

    def student_kinds(self) -> dict[str, str]:
        """Every student kind a plugin defines -> the plugin's name."""
        self.discover()
        return {kind: plugin for kind, (_, plugin) in sorted(self._student_kinds.items())}

    def student_schema(self, kind: str) -> type[StudentKindConfig]:
        self.discover()
        if kind not in self._student_kinds:
            known = ", ".join(["bert (the core's)", *(
                f"{name} ({plugin})" for name, plugin in self.student_kinds().items())])
            raise KeyError(f"unknown student kind {kind!r}; kinds: {known}")
        return self._student_kinds[kind][0]


def declared_augmenters(cls: type[Method]) -> list[type]:
    """The augmenter classes ``cls.augmenter`` is annotated to return, checked against the
    :class:`~harness.api.Augmenter` protocol when the plugin is registered; none when it is
    not overridden, declares the protocol itself, or its annotation does not resolve at
    import (a name imported for type checkers only): the runner checks the augmenter it
    builds then."""
    if cls.augmenter is Method.augmenter:
        return []
    try:
        returned = typing.get_type_hints(cls.augmenter).get("return")
    except Exception:  # any failure to resolve: the runner checks what it builds
        return []
    union = typing.get_origin(returned) in (typing.Union, types.UnionType)
    return [kind for kind in (typing.get_args(returned) if union else (returned,))
            if isinstance(kind, type) and kind is not type(None) and kind is not Augmenter]


def _error_line(error: BaseException) -> str:
    """An exception as one line: its type and message, with the file and line of a syntax
    error."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg}, {error.filename} line {error.lineno}"
    detail = (error_text(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {detail}"


registry = MethodRegistry()


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: make a method available by its ``name``."""
    return registry.register(cls)


def _validated_shape(name: str, shape: PluginStudentShape
                     ) -> tuple[StudentKindConfig | None, list[str]]:
    """A plugin kind's shape validated against its schema, or what is wrong with it as
    ``students.<name>.<key>: ...`` lines."""
    try:
        schema = registry.student_schema(shape.kind)
    except KeyError as error:
        return None, [f"students.{name}.kind: {error.args[0]}"]
    try:
        return schema.model_validate(shape.model_dump()), []
    except ValidationError as error:
        return None, [f"students.{name}.{'.'.join(map(str, item['loc']))}: "
                      f"{'unknown key' if item['type'] == 'extra_forbidden' else item['msg']}"
                      for item in error.errors()]


def student_shape_problems(name: str, shape: StudentConfig | PluginStudentShape) -> list[str]:
    """What is wrong with a suite's student shape ``name`` under its kind's schema (empty:
    nothing)."""
    if isinstance(shape, StudentConfig | StudentKindConfig):
        return []
    return _validated_shape(name, shape)[1]


def typed_student_shape(name: str, shape: StudentConfig | PluginStudentShape
                        ) -> StudentConfig | StudentKindConfig:
    """A suite's student shape as its kind's schema reads it: BERT shapes as they are, a
    plugin kind's validated against the schema its plugin registers."""
    if isinstance(shape, StudentConfig | StudentKindConfig):
        return shape
    typed, problems = _validated_shape(name, shape)
    if typed is None:
        raise ConfigError("; ".join(problems))
    return typed


def weighted_method(cls: type[Method], params: MethodParams, recipe: MethodRecipe) -> Method:
    """The method with its loss weights: its defaults (which may depend on ``params``),
    the recipe's ``loss_weights``, and 0 for its ``disabled_losses``."""
    method = cls(params, {})
    weights = {**method.default_weights(), **recipe.loss_weights}
    for term in recipe.disabled_losses:
        weights[term] = 0.0
    method.weights = weights
    return method


def instantiate(name: str, recipe: MethodRecipe | None = None, task: str | None = None
                ) -> Method:
    """Build a method from its recipe (with ``task``'s parameter overrides), validating
    params, weights and disabled terms."""
    cls = registry.get(name)
    recipe = recipe or MethodRecipe()
    try:
        params = cls.Params.model_validate(recipe.params_for(task))
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, item['loc']))}: "
            f"{'unknown parameter' if item['type'] == 'extra_forbidden' else item['msg']}"
            for item in error.errors()
        )
        raise ConfigError(f"methods.{name}.params: {problems}") from None
    term_names = {term.name for term in cls.loss_terms}
    for key in [*recipe.loss_weights, *recipe.disabled_losses]:
        if key not in term_names:
            raise ConfigError(f"methods.{name}: unknown loss term {key!r}; "
                              f"{name} has {sorted(term_names)}")
    method = weighted_method(cls, params, recipe)
    if undeclared := sorted(set(method.default_weights()) - term_names):
        raise ConfigError(f"{plugin_file(cls)}: {cls.__qualname__}.default_weights() weighs "
                          f"{undeclared}, which are not among its loss_terms "
                          f"{sorted(term_names)}: a term nobody computes trains nothing")
    return method


def undeclared_stage_terms(method: Method, stages: Iterable[Stage]) -> str | None:
    """What is wrong when a stage of ``method`` names a loss term the plugin does not
    declare (its loss would silently count for nothing), naming the plugin's file; None
    when every term is declared."""
    cls = type(method)
    term_names = {term.name for term in cls.loss_terms}
    for stage in stages:
        if undeclared := sorted(set(stage.loss_terms) - term_names):
            return (f"{plugin_file(cls)}: {cls.__qualname__}'s stage {stage.name!r} names "
                    f"loss term(s) {undeclared} that are not among its loss_terms "
                    f"{sorted(term_names)}")
    return None


def code_location(function: Callable[..., object]) -> tuple[Path, int] | None:
    """The file and first line a Python function is written at, read from its code (which
    knows them whether the plugin was imported as a module or loaded from a file); None
    for a callable without Python code."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None:
        return None
    return Path(code.co_filename), code.co_firstlineno


def plugin_file(cls: type) -> str:
    """Where a plugin class is written (its file, else its module), for messages that
    point a plugin's author at the line to fix."""
    for member in vars(cls).values():
        location = code_location(member) if inspect.isfunction(member) else None
        if location is not None:
            return str(location[0])
    module = sys.modules.get(cls.__module__)
    return getattr(module, "__file__", None) or cls.__module__

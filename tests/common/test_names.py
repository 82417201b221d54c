"""Names never lead out of the store: suite, method, variant, student shape and task names
are checked when a suite loads (the error names the file and the key), and every path the
harness joins a name into is checked to stay inside its folder (results store, cache,
tuned studies, report)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from harness.cli import app
from harness.common.cache import ArtifactCache
from harness.common.paths import (
    PathEscapeError,
    UnsafeNameError,
    check_name,
    contained,
    name_problem,
)
from harness.config.schema import SUITES_DIR, ConfigError, available_suites
from harness.experiments.store import ResultsStore
from harness.experiments.suites import load_suite
from harness.experiments.tuning import load_tuned, tuned_path
from harness.reporting import figures
from tests.config.test_config import write_suite

REPO = Path(__file__).resolve().parents[2]

BAD_NAMES = {
    "parent": "../../../../../outside",
    "absolute": "/tmp/outside",
    "separator": "runs/outside",
    "markup": "</script>",
}
"""A name per way out of the store: climbing, an absolute path, a separator, and markup
(whose ``/`` is a separator too)."""

MORE_BAD_NAMES = ["..", ".hidden", "a..b", "back\\slash", "sp ace", "x" * 65, "-dash", ""]

SHAPE = {"num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


def _name_kinds() -> dict[str, tuple[Callable[[dict[str, Any], str], None], str]]:
    """Each name kind: how to write a name of that kind into a suite, and the key path
    its error is reported under."""

    def suite(tree: dict[str, Any], name: str) -> None:
        tree["name"] = name

    def method(tree: dict[str, Any], name: str) -> None:
        tree["methods"][name] = {}

    def variant(tree: dict[str, Any], name: str) -> None:
        tree["methods"][name] = {"base": "kd", "params": {"alpha": 0.9}}

    def student(tree: dict[str, Any], name: str) -> None:
        tree["students"][name] = dict(SHAPE)

    def task(tree: dict[str, Any], name: str) -> None:
        tree["tasks"] = ["sst2", name]

    return {"suite": (suite, "name"), "method": (method, "methods"),
            "variant": (variant, "methods"), "student": (student, "students"),
            "task": (task, "tasks.1")}


NAME_KINDS = _name_kinds()


def load_error(path: Path, overrides: list[str] | None = None) -> list[str]:
    """The load error's lines after its first, which names the file."""
    with pytest.raises(ConfigError) as info:
        load_suite(str(path), overrides)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}: invalid recipe", lines
    return [line.strip() for line in lines[1:]]


# -- the rule -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["glue-cpu", "4L-192", "BiLSTM-150", "tinybert-no-da-pred",
                                  "kd_3.L", "x" * 64])
def test_a_safe_name_passes(name: str) -> None:
    assert name_problem(name) is None and check_name(name) == name


@pytest.mark.parametrize("name", [*BAD_NAMES.values(), *MORE_BAD_NAMES])
def test_an_unsafe_name_is_refused_naming_it(name: str) -> None:
    with pytest.raises(UnsafeNameError, match="is not a valid name") as info:
        check_name(name)
    assert repr(name) in str(info.value)


def test_committed_suites_and_records_pass_the_rule() -> None:
    for suite_name in available_suites():
        suite = load_suite(suite_name)
        names = [suite.name, suite.record_suite, *suite.methods, *suite.students,
                 *suite.tasks]
        assert [name for name in names if name_problem(name)] == [], suite_name
    records = [path for path in (REPO / "results").rglob("*.json")
               if path.relative_to(REPO / "results").parts[0] != "bench"]
    assert records
    for path in records:
        record = json.loads(path.read_text())
        names = [record["suite"], record["method"], record["task"],
                 record["config"]["student"]["name"]]
        assert [name for name in names if name_problem(name)] == [], path


# -- at load: the file and the key ----------------------------------------------------------
@pytest.mark.parametrize("way", list(BAD_NAMES))
@pytest.mark.parametrize("kind", list(NAME_KINDS))
def test_a_bad_name_stops_the_load_at_its_key(tmp_path: Path, kind: str, way: str) -> None:
    write, key_path = NAME_KINDS[kind]
    bad = BAD_NAMES[way]
    problems = load_error(write_suite(tmp_path, lambda tree: write(tree, bad)))
    line = next((line for line in problems if line.startswith(f"{key_path}:")), None)
    assert line is not None, problems
    assert repr(bad) in line, line
    expected = "unknown task" if kind == "task" else "is not a valid name"
    assert expected in line, line
    if key_path in ("methods", "students"):  # a mapping's key: said to be a key
        assert line.startswith(f"{key_path}: key {bad!r} is not a valid name"), line


@pytest.mark.parametrize(("key", "value", "key_path"), [
    ("methods.kd.student", "../4L-192", "methods.kd.student"),
    ("methods.kd.base", "/abs/kd", "methods.kd.base"),
    ("methods.kd.init_from", "a/finetune", "methods.kd.init_from"),
    ("default_student", "..", "default_student"),
    ("default_method", "</script>", "default_method"),
    ("protocol", "../../glue-cpu", "protocol"),
    ("grid.methods", "[kd, ../up]", "grid.methods.1"),
])
def test_a_name_that_refers_to_another_is_checked_too(tmp_path: Path, key: str, value: str,
                                                        key_path: str) -> None:
    problems = load_error(write_suite(tmp_path), [f"{key}={value}"])
    line = next((line for line in problems if line.startswith(f"{key_path}:")), None)
    assert line is not None, problems
    assert "is not a valid name" in line and f"(from --set {key}={value})" in line, line


def test_a_bad_key_written_in_an_extended_suite_names_that_file(tmp_path: Path) -> None:
    parent = write_suite(tmp_path, lambda tree: tree["methods"].update(
        {BAD_NAMES["parent"]: {"base": "kd"}}))
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {parent.name}\nmethods:\n  kd-hot: {{base: kd}}\n")
    problems = load_error(child)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"methods: key {BAD_NAMES['parent']!r} is not a valid name "
                                  "(letters, digits, '.', '_' and '-', starting with a letter "
                                  "or digit, at most 64 characters, no '..')"), problems
    assert problems[0].endswith(f"{parent})"), problems  # written there, not in the child


@pytest.mark.parametrize("name", ["../suites/glue-cpu", "/etc/passwd", "a/b"])
def test_a_suite_name_is_never_a_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"neither an existing \.yaml file nor a suite name"):
        load_suite(name)
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {name}\n")
    with pytest.raises(ConfigError) as info:
        load_suite(str(child))
    assert str(info.value).startswith(f"{child}: extends: unknown suite {name!r}: neither")


def test_a_suite_that_exists_outside_suites_is_not_reached_by_name(tmp_path: Path) -> None:
    # A YAML file beside suites/ that a name climbing out of it would reach.
    assert (SUITES_DIR.parent / "pyproject.toml").is_file()
    with pytest.raises(ConfigError, match=r"neither an existing \.yaml file nor a suite name"):
        load_suite("../pyproject")


# -- at write: contained() ------------------------------------------------------------------
def test_contained_joins_components_inside_the_root(tmp_path: Path) -> None:
    assert contained(tmp_path, "glue-cpu", "kd", "rte", "x.json") == \
        tmp_path / "glue-cpu" / "kd" / "rte" / "x.json"
    assert contained(str(tmp_path)) == tmp_path
    assert contained(Path("relative"), "a") == Path("relative/a")


@pytest.mark.parametrize(("part", "why"), [
    ("..", "folder above"), (".", "folder above"), ("../x", "separator"),
    ("/tmp/x", "separator"), ("a/b", "separator"), ("a\\b", "separator"),
    ("</script>", "separator"), ("", "non-empty"), ("a\0b", "NUL"), ("C:x", "absolute"),
])
def test_contained_refuses_a_part_that_is_not_one_component(tmp_path: Path, part: str,
                                                            why: str) -> None:
    with pytest.raises(PathEscapeError, match=why) as info:
        contained(tmp_path, "fine", part)
    assert repr(part) in str(info.value) and str(tmp_path) in str(info.value)
    assert isinstance(info.value, ValueError)  # the commands report ValueErrors as errors


def test_a_folder_linked_inside_the_root_stays_usable(tmp_path: Path) -> None:
    elsewhere = tmp_path / "big-disk"
    elsewhere.mkdir()
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "glue-cpu").symlink_to(elsewhere)
    path = contained(tmp_path / "store", "glue-cpu", "kd")
    assert path.parent.resolve() == elsewhere


@pytest.mark.parametrize("way", list(BAD_NAMES))
def test_record_path_refuses_a_bad_name(tmp_path: Path, way: str) -> None:
    root = tmp_path / "a" / "b" / "c" / "d" / "e" / "results"
    store = ResultsStore(root)
    good = ("glue-cpu", "kd", "rte", "4L-192-seed1-0123456789abcdef")
    assert store.record_path(*good) == root / "glue-cpu" / "kd" / "rte" / f"{good[3]}.json"
    for index in range(4):
        parts = list(good)
        parts[index] = BAD_NAMES[way]
        with pytest.raises(PathEscapeError, match="cannot be part of a path under"):
            store.record_path(*parts)
    assert not list(tmp_path.rglob("*"))  # nothing made, inside the store or out of it


@pytest.mark.parametrize("way", list(BAD_NAMES))
def test_cache_path_refuses_a_bad_kind_or_key(tmp_path: Path, way: str) -> None:
    cache = ArtifactCache(tmp_path / "cache")
    assert cache.path("teachers", "ab12") == tmp_path / "cache" / "teachers" / "ab12"
    for kind, key in (("teachers", BAD_NAMES[way]), (BAD_NAMES[way], "ab12")):
        with pytest.raises(PathEscapeError):
            cache.path(kind, key)
        with pytest.raises(PathEscapeError), cache.build(kind, key, {"what": "test"}):
            pass
    assert not list(tmp_path.rglob("*outside*"))


def test_a_tuned_study_name_stays_in_the_tuned_folder(tmp_path: Path) -> None:
    assert tuned_path(tmp_path, "tune-glue-cpu-kd-rte-0123456789") == \
        tmp_path / "tuned" / "tune-glue-cpu-kd-rte-0123456789.yaml"
    with pytest.raises(PathEscapeError):
        tuned_path(tmp_path, "../../outside")
    with pytest.raises(FileNotFoundError, match="neither a file nor a study name"):
        load_tuned("../../outside", tmp_path)


def test_a_figure_name_stays_in_the_figures_folder(tmp_path: Path) -> None:
    out = tmp_path / "report" / "figures"
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    with pytest.raises(PathEscapeError):
        figures.save(fig, out, "../../outside")
    assert [path.name for path in figures.save(fig, out, "curves")] == ["curves.png",
                                                                        "curves.svg"]
    assert not list(tmp_path.rglob("*outside*"))


# -- the cases, end to end ----------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize(("edit", "method", "expected"), [
    (f"methods:\n  '{BAD_NAMES['parent']}': {{base: kd}}\n", BAD_NAMES["parent"],
     f"methods: key {BAD_NAMES['parent']!r} is not a valid name"),
    ("name: ../../../../../outside-suite\n", "kd",
     "name: '../../../../../outside-suite' is not a valid name"),
    ("methods:\n  '</script>outside': {base: kd}\n", "</script>outside",
     "methods: key '</script>outside' is not a valid name"),
])
def test_harness_run_refuses_a_name_that_leads_out(tmp_path: Path, edit: str, method: str,
                                                   expected: str) -> None:
    results = tmp_path / "a" / "b" / "c" / "d" / "e" / "results"
    suite = tmp_path / "escape.yaml"
    suite.write_text("extends: glue-cpu\n" + edit)
    result = CliRunner().invoke(app, ["run", "--suite", str(suite), "--method", method,
                                      "--tasks", "rte", "--seeds", "1",
                                      "--results", str(results),
                                      "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 2, result.output
    assert f"error: {suite}: invalid recipe" in result.output
    assert expected in result.output
    assert not list(tmp_path.rglob("*outside*")) and not list(tmp_path.rglob("*script*"))
    assert not results.exists()


@pytest.mark.e2e
@pytest.mark.parametrize(("option", "value", "expected"), [
    ("--method", "../../outside", "--method: '../../outside' is not a valid name"),
    ("--tasks", "../../outside", "tasks: unknown task '../../outside'"),
    ("--suite", "../../outside", "unknown suite '../../outside': neither"),
])
def test_harness_run_refuses_an_option_that_leads_out(tmp_path: Path, option: str,
                                                      value: str, expected: str) -> None:
    args = {"--suite": "glue-cpu", "--method": "kd", "--tasks": "rte", option: value}
    result = CliRunner().invoke(app, ["run", *(item for pair in args.items() for item in pair),
                                      "--seeds", "1", "--results", str(tmp_path / "results")])
    assert result.exit_code == 2, result.output
    assert expected in result.output, result.output
    assert not (tmp_path / "results").exists()

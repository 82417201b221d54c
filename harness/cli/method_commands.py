"""``harness list`` and ``harness new-method``: what is registered and available, and a
new plugin's skeleton with the command of its tiny run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated

import typer

from harness.common.cli_options import REPO_ROOT, echo, fail
from harness.config.schema import available_suites
from harness.experiments.suites import load_suite


def list_(what: Annotated[str, typer.Argument(help="methods, suites or tasks")] = "methods"
          ) -> None:
    """List registered methods, available suites or GLUE tasks."""
    if what == "methods":
        from harness.api.registry import registry

        for name, cls in registry.items():
            terms = ", ".join(term.name for term in cls.loss_terms)
            echo(f"{name:<14} {cls.description}  [loss terms: {terms}]")
    elif what == "suites":
        for name in available_suites():
            config = load_suite(name)
            echo(f"{name:<18} {config.description}")
    elif what == "tasks":
        from harness.data.tasks import GLUE_TASKS

        for spec in GLUE_TASKS.values():
            kind = "regression" if spec.is_regression else f"{spec.num_labels} classes"
            echo(f"{spec.name:<6} {spec.display_name:<6} {kind:<12} main metric "
                  f"{spec.main_metric}; dev splits {', '.join(spec.dev_splits)}")
    else:
        fail(f"cannot list {what!r}: choose methods, suites or tasks")


def new_method(
    name: Annotated[str, typer.Argument(help="method name, e.g. my-kd")],
    directory: Annotated[Path, typer.Option(help="where to write the module")] =
        REPO_ROOT / "methods",
) -> None:
    """Write a plugin skeleton that passes the contract test, and print the command of a
    tiny run of it (a few steps of every stage, one task and seed, a scratch store)."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        fail("method names are lower case letters, digits and dashes, starting with a letter")
    module = name.replace("-", "_")
    path = directory / f"{module}.py"
    if path.exists():
        fail(f"{path} exists")
    if not directory.is_dir():
        fail(f"--directory {directory}: no such folder")
    from harness.api.registry import registry
    from harness.common.files import write_text_atomic

    # a second plugin of a registered name, or a module beside a package of its name, is
    # never the one loaded
    if name in registry.names():
        fail(f"a method {name!r} is registered already ({registry.get(name).__module__}); "
             "pick another name")
    if (directory / module).is_dir():
        fail(f"{directory / module} is a package of that name; pick another name")
    class_name = "".join(part.capitalize() for part in module.split("_"))
    template = (Path(__file__).parents[1] / "api" / "method_template.py.txt").read_text()
    write_text_atomic(path, template.replace("{{name}}", name)
                      .replace("{{class_name}}", class_name))
    builtin = directory.resolve() == (REPO_ROOT / "methods").resolve()
    echo(f"wrote {path}: edit its loss terms and stages, then "
         + ("" if builtin else "register the module as an entry point of the group "
            "'harness.methods' in its package (methods/ is the only folder searched), then ")
         + f"run the contract test (pytest tests/api/test_contract.py -k {name}) and a tiny run "
         "(a few steps of every stage, one task and seed, a scratch store and cache; "
         "docs/adding-a-method.md, 'Budgets for a tiny run'):\n" + tiny_run_command(name))


TINY_RUN_SETS = ("training.max_steps=5", "teacher.training.max_steps=5",
                 "teacher.min_margin=-100", "data.max_train_examples.rte=200",
                 "corpus.max_sentences=200")
"""The budgets of the run ``new-method`` prints: 5 steps of every student stage, general
ones included, and of the teacher's fine-tuning (whose score then does not have to beat
the majority class), 200 RTE training pairs and 200 corpus sentences."""


def tiny_run_command(name: str) -> str:
    """A ``harness run`` of method ``name`` on glue-cpu at the budgets of
    :data:`TINY_RUN_SETS`, RTE seed 1, into a store and cache of its own in the temporary
    folder; one option a line, as a shell reads it."""
    import tempfile

    scratch = Path(tempfile.gettempdir()) / f"harness-{name}"
    options = [f"--method {name} --tasks rte --seeds 1",
               *(f"--set {assignment}" for assignment in TINY_RUN_SETS),
               f"--results {shlex.quote(str(scratch / 'results'))}",
               f"--cache-dir {shlex.quote(str(scratch / 'cache'))}"]
    return " \\\n  ".join(["harness run --suite glue-cpu", *options])

"""The code behind a run's numbers: digests of the method plugins' sources and of the core
modules that compute losses and metrics.

Every record names them (``RunRecord.code``) and the general-checkpoint cache keys on them,
so a result of one plugin's code is never taken for the result of another:

* a stored run whose code differs from the code now loaded is *stale*: ``harness run`` and
  ``harness grid`` train it again (the new record replaces the stale one under the same run
  id), and reports leave stale records out of their tables and name them;
* a general checkpoint distilled by other plugin code is distilled again.

Records made before records named their code carry the digests of the commit that first
gave them (``attested``: that commit), not of the code that ran them, which may differ from
it in ways that kept their run ids; a change after that commit stales them like any other.

A digest covers the code, not its layout: each Python file is hashed as its syntax tree
with docstrings left out (comments, blank lines and formatting never reach the tree), so
editing a comment or a docstring stales nothing, while any change to what the code does
stales every record it made. Files other than Python in a plugin's package (word lists,
templates) are hashed byte for byte. The run id does not hash the code: the same
configuration keeps its id, and the store holds one record of it, made by the code that
made it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import harness
from harness.api.registry import registry
from harness.config import identity

CORE_SOURCES = ("api/losses.py", "data/metrics.py", "data/glue_metric")
"""The core's loss and metric code (paths under the ``harness`` package): a change to any of
them changes what every method's records hold."""

_SKIPPED_PARTS = {"__pycache__"}


def _canonical(node: Any) -> Any:
    """A JSON-able form of an AST node that is the same on every Python version this
    project supports: fields a version adds empty (``type_params``) or leaves None are left
    out, and so are positions."""
    if isinstance(node, ast.AST):
        return [type(node).__name__, {name: _canonical(value)
                                      for name, value in ast.iter_fields(node)
                                      if value is not None and value != []}]
    if isinstance(node, list):
        return [_canonical(item) for item in node]
    return repr(node)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef |
                       ast.AsyncFunctionDef) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def file_digest(path: Path) -> str:
    """The digest of one source file: its code (:func:`_canonical` syntax tree without
    docstrings) for Python, its bytes otherwise (and for Python that does not parse)."""
    status = path.stat()
    return _file_digest(path, status.st_mtime_ns, status.st_size)


@lru_cache(maxsize=1024)
def _file_digest(path: Path, modified_ns: int, size: int) -> str:
    """:func:`file_digest`, computed once per version of the file (its time and size)."""
    data = path.read_bytes()
    if path.suffix == ".py":
        try:
            tree = _without_docstrings(ast.parse(data, filename=str(path)))
        except SyntaxError:
            pass
        else:
            data = json.dumps(_canonical(tree), separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()


def _source_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(path for path in root.rglob("*") if path.is_file()
                  and not _SKIPPED_PARTS & set(path.relative_to(root).parts)
                  and path.suffix not in {".pyc", ".pyo"})


def sources_digest(roots: Iterable[Path]) -> str:
    """One digest over the files of ``roots`` (files, or folders read recursively), each
    named by its path relative to its root so that a renamed file counts as a change."""
    digest = hashlib.sha256()
    for root in roots:
        for path in _source_files(root):
            name = path.name if root.is_file() else path.relative_to(root).as_posix()
            digest.update(f"{name}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def plugin_sources(cls: type) -> list[Path]:
    """The source of a plugin class: its module's file, or its package's folder when the
    plugin is a package (``methods/tinybert/``), and the same for each plugin class it
    derives from outside the core."""
    roots: list[Path] = []
    for klass in cls.__mro__:
        module_name = klass.__module__
        if module_name == "builtins" or module_name.split(".")[0] == "harness":
            continue
        file = getattr(sys.modules.get(module_name), "__file__", None) or _defined_in(klass)
        if file is None:
            continue
        path = Path(file)
        root = path.parent if path.name == "__init__.py" else path
        if root not in roots:
            roots.append(root)
    return roots


def _defined_in(klass: type) -> str | None:
    """The file a class's methods were compiled from (a module loaded from a path without
    entering ``sys.modules``, as a plugin file loaded by hand is)."""
    for member in vars(klass).values():
        code = getattr(member, "__code__", None)
        if code is not None and Path(code.co_filename).is_file():
            return code.co_filename
    return None


def plugin_digest(plugin: str | type) -> str:
    """The digest of a plugin's code (:func:`plugin_sources`): a registered name, or the
    plugin class."""
    return sources_digest(plugin_sources(registry.get(plugin) if isinstance(plugin, str)
                                         else plugin))


def core_digest() -> str:
    """The digest of the core's loss and metric code (:data:`CORE_SOURCES`)."""
    package = Path(harness.__file__).parent
    return sources_digest(package / name for name in CORE_SOURCES)


def run_code(plugins: Iterable[str]) -> dict[str, Any]:
    """What a record names as the code that made it: the digest of each plugin the run
    executed (its own, and the one whose general checkpoint it starts from), and the core's."""
    return {"plugins": {name: plugin_digest(name) for name in sorted(set(plugins))},
            "core": core_digest()}


def general_cache_key(general_key: str, plugin: type) -> str:
    """The cache key of a general checkpoint: its key in the run's configuration (what it
    is distilled from and how) with the code that distils it (``plugin``'s and the core's),
    so that other code distils a checkpoint of its own."""
    return identity.general_cache_key(general_key, plugin_digest(plugin), core_digest())


def code_change(recorded: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """Why a record made by ``recorded`` code is stale against ``current``; None when the
    same code made it, or when the record predates code digests (``recorded`` None: such
    records are kept as they are)."""
    if recorded is None:
        return None
    changes = []
    before, now = recorded.get("plugins", {}), current["plugins"]
    for name in sorted(set(before) | set(now)):
        if before.get(name) != now.get(name):
            changes.append(f"plugin {name}'s code ({_short(before.get(name))} -> "
                           f"{_short(now.get(name))})")
    if recorded.get("core") != current["core"]:
        changes.append(f"the core's loss and metric code ({_short(recorded.get('core'))} -> "
                       f"{_short(current['core'])})")
    return "made by other code: " + ", ".join(changes) if changes else None


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "none"

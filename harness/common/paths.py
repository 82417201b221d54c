"""Names that become parts of paths, and paths that stay inside their folder.

Suite, method, variant, student shape and task names name folders and files of the results
store, the cache and reports.  Two checks keep a name from writing anywhere else:
:func:`check_name` when a recipe or a command-line option is read (a safe character set and
length), and :func:`contained` wherever a name is joined into a path that is written (each
part one path component, the joined path inside its root).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["MAX_NAME_LENGTH", "NAME_RULE", "PathEscapeError", "UnsafeNameError",
           "check_name", "contained", "name_problem"]

MAX_NAME_LENGTH = 64
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_LENGTH - 1}}}")

NAME_RULE = (f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most "
             f"{MAX_NAME_LENGTH} characters, no '..'")
"""What a suite, method, variant, student shape or task name may be, in words."""


class UnsafeNameError(ValueError):
    """A name that cannot name a folder or file of the store (the message says why)."""


class PathEscapeError(ValueError):
    """A path part that would leave the folder it is written under (the message names the
    part and the folder)."""


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a safe name (see :data:`NAME_RULE`); None when it is."""
    if not isinstance(name, str):
        return f"expected a name, got {type(name).__name__}"
    if not _NAME.fullmatch(name) or ".." in name:
        return f"{name!r} is not a valid name ({NAME_RULE})"
    return None


def check_name(name: str) -> str:
    """``name`` when it is safe to put in a path, else :class:`UnsafeNameError`."""
    problem = name_problem(name)
    if problem is not None:
        raise UnsafeNameError(problem)
    return name


def _part_problem(part: object) -> str | None:
    """Why ``part`` is not exactly one path component (None when it is)."""
    if not isinstance(part, str) or not part:
        return "not a non-empty string"
    if part in {".", ".."}:
        return "it names a folder above or the folder itself"
    if "\0" in part:
        return "it holds a NUL character"
    if any(sep in part for sep in {"/", "\\", os.sep, os.altsep or "/"}):
        return "it holds a path separator"
    if PurePosixPath(part).is_absolute() or PureWindowsPath(part).drive:
        return "it is an absolute path"
    return None


def contained(root: Path | str, *parts: str) -> Path:
    """``root / part / ...``, each part one path component (no separator, not ``..``,
    not absolute), checked to lie inside ``root``; else :class:`PathEscapeError` naming
    the part.

    The check is made on the absolute, normalised path without following links below
    ``root``: a folder of the store that the user linked to another disk stays usable,
    while no name can lead out of the store."""
    root = Path(root)
    for part in parts:
        problem = _part_problem(part)
        if problem is not None:
            raise PathEscapeError(f"{part!r} cannot be part of a path under {root}: "
                                  f"{problem}")
    path = root.joinpath(*parts)
    base = os.path.normpath(os.path.abspath(root))
    joined = os.path.normpath(os.path.abspath(path))
    if os.path.commonpath([base, joined]) != base:  # a guard behind the part checks
        raise PathEscapeError(f"{path} lies outside {root}")
    return path

"""The Optuna storage every study and grid queue lives in: SQLite beside the results store
for one machine, or a PostgreSQL (any SQLAlchemy) database for workers on several, with
worker heartbeats and the retry of a dead worker's trial.  Kept apart from the tuner so
that opening a storage needs Optuna and SQLAlchemy only, not the models.

A storage URL may hold a password; it is shown only through :func:`mask_url`, and every
error about a storage is raised with its text passed through :func:`scrub`.  The password
can also stay out of the URL: PostgreSQL's ``PGPASSWORD`` and ``~/.pgpass`` (libpq reads
them when the URL has none), or ``?password_env=NAME``, the environment variable holding
it (:func:`resolve_url`)."""

from __future__ import annotations

import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.experiments.store import StoreNotWritableError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

HEARTBEAT_SECONDS = int(os.environ.get("HARNESS_HEARTBEAT_SECONDS", "30"))
"""How often a worker marks its running trial alive; a trial silent for
``GRACE_SECONDS`` is failed and retried by another worker."""
GRACE_SECONDS = int(os.environ.get("HARNESS_GRACE_SECONDS", str(4 * HEARTBEAT_SECONDS)))
MAX_RETRIES = 3
STORAGE_ATTEMPTS = 5
PASSWORD_ENV = "password_env"
"""The URL query key naming the environment variable that holds the password."""
CONNECT_TIMEOUT_SECONDS = 10
"""How long :func:`check_storage` waits for a PostgreSQL server to answer."""
MASK = "***"
HINT = "pass sqlite:///PATH or postgresql+psycopg2://USER@HOST/DB"


class StorageError(RuntimeError):
    """A storage URL that cannot be used; its message shows the URL masked."""


def default_storage(results: Path) -> str:
    """SQLite beside the results store: one machine, any number of local workers."""
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StoreNotWritableError(
            f"results store {results}: cannot hold the study's database "
            f"({error.strerror or error}); pass a writable --results folder") from None
    return f"sqlite:///{(results / 'optuna.db').resolve()}"


def _parse(url: str) -> URL | None:
    """``url`` parsed by SQLAlchemy, or None where it does not parse into parts that keep
    the password apart (an unescaped ``@`` in a password leaves part of it in the host)."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # ArgumentError, or ValueError for a bad port
        return None
    if "@" in (parsed.host or ""):
        return None
    return parsed


def _secret_key(key: str) -> bool:
    """Whether a URL query key carries a password (``password``, ``sslpassword``, ...)."""
    key = key.lower()
    return key != PASSWORD_ENV and ("password" in key or key in {"pwd", "passwd"})


def mask_url(url: str) -> str:
    """``url`` as it may be printed, logged or written: its password (and any
    password-like query value) replaced by ``***``; a URL that does not parse has
    everything between ``://`` (or its start) and its last ``@`` masked."""
    parsed = _parse(url)
    if parsed is None:
        return _mask_userinfo(url)
    masked = url  # as typed, not re-rendered (which would escape ``:memory:``, say)
    if parsed.password is not None:
        masked = re.sub(r"^([^:]*://[^:/]*:)[^@]*@", lambda m: f"{m.group(1)}{MASK}@", masked,
                        count=1)
    for key in parsed.query:
        if _secret_key(key):
            masked = re.sub(rf"([?&]{re.escape(key)}=)[^&]*", lambda m: m.group(1) + MASK,
                            masked)
    if parsed.password and any(form in masked for form in _forms(parsed.password)):
        return _mask_userinfo(masked)  # written in a way the pattern above missed
    return masked


def _mask_userinfo(url: str) -> str:
    """Everything between ``://`` (or the start) and the last ``@`` masked."""
    if "://" not in url:
        return re.sub(r"^.*@", f"{MASK}@", url, flags=re.DOTALL)
    return re.sub(r"://.*@", f"://{MASK}@", url, flags=re.DOTALL)


def _forms(secret: str) -> set[str]:
    """``secret`` as decoded and as a URL would escape it."""
    from urllib.parse import quote

    return {secret, quote(secret, safe=""), quote(secret)}


def _secrets(url: str) -> list[str]:
    """The password-like parts of ``url``, as written and as decoded."""
    from urllib.parse import unquote

    parsed = _parse(url)
    found = {url}
    match = re.search(r"://(.*)@", url, flags=re.DOTALL)
    if match and ":" in match.group(1):  # the userinfo as written, however it parses
        found.add(match.group(1).split(":", 1)[1])
    if parsed is not None:
        found.add(parsed.password or "")
        found.update(str(value) for key, value in parsed.query.items() if _secret_key(key))
    found |= {unquote(text) for text in found}
    return sorted((text for text in found if text), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with ``url`` masked and its password, as written or
    decoded, and any password taken from the environment (:func:`resolve_url`) replaced
    by ``***``."""
    secrets = _secrets(url)
    name = _password_env(url)
    if name and os.environ.get(name):
        secrets.append(os.environ[name])
    masked = mask_url(url)
    text = text.replace(url, masked) if url else text
    for secret in sorted(secrets, key=len, reverse=True):
        if secret != masked:
            text = text.replace(secret, MASK)
    return text


def _password_env(url: str) -> str | None:
    parsed = _parse(url)
    return None if parsed is None else parsed.query.get(PASSWORD_ENV)  # type: ignore[return-value]


def resolve_url(url: str) -> URL:
    """The URL the database is opened with: the password of ``?password_env=NAME`` taken
    from the environment variable NAME (the query key removed), and a bare
    ``postgresql://`` opened with psycopg2, the driver the harness installs (SQLAlchemy
    2.1 would pick psycopg 3 for it).  A StorageError for a URL that does not parse or
    names an unset variable."""
    parsed = _parse(url)
    if parsed is None:
        raise StorageError(f"--storage {mask_url(url)}: not a database URL this can open "
                           f"(it does not parse as scheme://user:password@host:port/name); "
                           f"{HINT}")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    name = parsed.query.get(PASSWORD_ENV)
    if name is None:
        return parsed
    if isinstance(name, tuple) or not name:
        raise StorageError(f"--storage {mask_url(url)}: {PASSWORD_ENV} must name one "
                           "environment variable")
    if parsed.password is not None:
        raise StorageError(f"--storage {mask_url(url)}: a password and {PASSWORD_ENV}="
                           f"{name}; give the password one way")
    if not os.environ.get(name):
        raise StorageError(f"--storage {mask_url(url)}: {PASSWORD_ENV}={name}, but the "
                           f"environment variable {name} is not set (or empty)")
    return parsed.difference_update_query([PASSWORD_ENV]).set(password=os.environ[name])


def in_memory_sqlite(url: str) -> bool:
    """Whether ``url`` names an in-memory SQLite database (``sqlite://``, ``sqlite:///``,
    ``sqlite:///:memory:``)."""
    parsed = _parse(url)
    if parsed is None or parsed.get_backend_name() != "sqlite":
        return False
    database = parsed.database or ""
    return database in {"", ":memory:"} or (database.startswith("file:")
                                            and "mode=memory" in url)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _storage_error(url: str, error: BaseException) -> StorageError:
    """``error``, raised while opening the storage at ``url``, as one line that names the
    URL masked and holds no part of its password."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    if isinstance(error, StorageError):
        return error
    cause = error.__cause__ if isinstance(error.__cause__, ImportError) else error
    if isinstance(error, (ArgumentError, NoSuchModuleError)):
        text = f"not a database URL this can open ({_first_line(error)}); {HINT}"
    elif isinstance(cause, ImportError):
        module = cause.name or _first_line(cause)
        text = (f"its database driver needs the Python module {module}, which is not "
                f"installed; install it, or {HINT} (psycopg2 is installed by `make setup`)")
    else:
        reason = _first_line(getattr(error, "orig", None) or error)
        text = (f"cannot open the database ({reason}); check its host, credentials and "
                "name, or the folder of a SQLite file")
    return StorageError(scrub(f"--storage {mask_url(url)}: {text}", url))


def _engine_kwargs(resolved: URL, check: bool = False) -> dict[str, Any]:
    if resolved.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": 60}}  # several local workers share it
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if check and resolved.get_driver_name() == "psycopg2" and (
            "connect_timeout" not in resolved.query):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    return kwargs


def _refuse_in_memory(url: str) -> None:
    if in_memory_sqlite(url):
        raise StorageError(f"--storage {mask_url(url)}: an in-memory SQLite database; a "
                           "study must persist: pass a file path, e.g. "
                           "sqlite:///path/study.db")


def _new_sqlite_file(url: str, resolved: URL) -> bool:
    """Whether ``resolved`` is a SQLite file that does not exist yet, in a folder that
    does: a connection would create it, and a command refused later (a bad search space,
    say) must leave no database behind.  A StorageError when the folder is missing."""
    database = resolved.database or ""
    if resolved.get_backend_name() != "sqlite" or database.startswith("file:"):
        return False
    path = Path(database)
    if path.exists():
        return False
    if not path.parent.is_dir():
        raise StorageError(f"--storage {mask_url(url)}: cannot open the database (no folder "
                           f"{path.parent}); check the folder of the SQLite file")
    return True


def check_storage(url: str) -> None:
    """Open and close one connection to the storage at ``url``: an unknown scheme, a driver
    that is not installed, an unset ``password_env`` variable or a database that does not
    answer is a one-line StorageError before anything is planned or trained."""
    from sqlalchemy import create_engine

    _refuse_in_memory(url)
    engine = None
    try:
        resolved = resolve_url(url)
        if _new_sqlite_file(url, resolved):
            return
        engine = create_engine(resolved, **_engine_kwargs(resolved, check=True))
        engine.connect().close()
    except Exception as error:  # every error, its text scrubbed
        raise _storage_error(url, error) from None
    finally:
        if engine is not None:
            engine.dispose()


def open_storage(url: str):
    """An Optuna RDB storage with worker heartbeats and retry of dead workers' trials.

    An in-memory SQLite database is refused: each connection of the engine's pool (the
    heartbeat thread's, another worker's) sees its own empty database, and a study must
    outlive the command that runs it to be resumed and to give its parameters.  Errors are
    StorageErrors whose text holds no part of the password."""
    import optuna

    _refuse_in_memory(url)
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats are marked experimental in Optuna; they are what a multi-worker study needs.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            resolved = resolve_url(url)
            return RDBStorage(resolved.render_as_string(hide_password=False),
                              heartbeat_interval=HEARTBEAT_SECONDS,
                              grace_period=GRACE_SECONDS,
                              heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                                  max_retry=MAX_RETRIES),
                              engine_kwargs=_engine_kwargs(resolved))
        except (OperationalError, ProgrammingError, IntegrityError) as error:
            # Workers started together on a new database race to create its tables ("table
            # ... already exists"); the loser finds them made on its next try.
            if attempt == STORAGE_ATTEMPTS - 1:
                raise _storage_error(url, error) from None
            time.sleep(0.5 * (attempt + 1))
        except Exception as error:  # every error, its text scrubbed
            raise _storage_error(url, error) from None
    raise AssertionError("unreachable")


def hide_in_argv(url: str) -> None:
    """Mask ``url`` in ``sys.argv`` (``--storage URL`` or ``--storage=URL``), where
    experiment trackers that record the command line would read it."""
    masked = mask_url(url)
    for index, arg in enumerate(sys.argv):
        if url in arg:
            sys.argv[index] = arg.replace(url, masked)


def command_storage(given: str | None, results: Path, check: bool = True) -> str:
    """The storage a command uses: ``--storage`` as ``given``, else SQLite beside the
    results (:func:`default_storage`); masked in ``sys.argv`` and, with ``check``, opened
    once (:func:`check_storage`) so that a storage that cannot be used stops the command
    before it plans anything."""
    url = given or default_storage(results)
    hide_in_argv(url)
    if check:
        check_storage(url)
    return url

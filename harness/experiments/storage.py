"""The Optuna storage every study and grid queue lives in: SQLite beside the results store
for one machine, or a PostgreSQL (any SQLAlchemy) database for workers on several, with
worker heartbeats and the retry of a dead worker's trial.  Kept apart from the tuner so
that opening a storage needs Optuna and SQLAlchemy only, not the models."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

from harness.experiments.store import StoreNotWritableError

HEARTBEAT_SECONDS = int(os.environ.get("HARNESS_HEARTBEAT_SECONDS", "30"))
"""How often a worker marks its running trial alive; a trial silent for
``GRACE_SECONDS`` is failed and retried by another worker."""
GRACE_SECONDS = int(os.environ.get("HARNESS_GRACE_SECONDS", str(4 * HEARTBEAT_SECONDS)))
MAX_RETRIES = 3
STORAGE_ATTEMPTS = 5


def default_storage(results: Path) -> str:
    """SQLite beside the results store: one machine, any number of local workers."""
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StoreNotWritableError(
            f"results store {results}: cannot hold the study's database "
            f"({error.strerror or error}); pass a writable --results folder") from None
    return f"sqlite:///{(results / 'optuna.db').resolve()}"


def in_memory_sqlite(url: str) -> bool:
    """Whether ``url`` names an in-memory SQLite database (``sqlite://``, ``sqlite:///``,
    ``sqlite:///:memory:``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return False
    if parsed.get_backend_name() != "sqlite":
        return False
    database = parsed.database or ""
    return database in {"", ":memory:"} or (database.startswith("file:")
                                            and "mode=memory" in url)


def open_storage(url: str):
    """An Optuna RDB storage with worker heartbeats and retry of dead workers' trials.

    An in-memory SQLite database is refused: each connection of the engine's pool (the
    heartbeat thread's, another worker's) sees its own empty database, and a study must
    outlive the command that runs it to be resumed and to give its parameters."""
    import optuna

    if in_memory_sqlite(url):
        raise RuntimeError(f"--storage {url}: an in-memory SQLite database; a study must "
                           "persist: pass a file path, e.g. sqlite:///path/study.db")
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats are marked experimental in Optuna; they are what a multi-worker study needs.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}  # several local workers share it
    else:
        engine_kwargs["pool_pre_ping"] = True
    from sqlalchemy.exc import (
        ArgumentError,
        IntegrityError,
        NoSuchModuleError,
        OperationalError,
        ProgrammingError,
    )

    for attempt in range(STORAGE_ATTEMPTS):
        try:
            return RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS,
                              grace_period=GRACE_SECONDS,
                              heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                                  max_retry=MAX_RETRIES),
                              engine_kwargs=engine_kwargs)
        except ImportError as error:
            raise RuntimeError(f"storage {url}: {error}. PostgreSQL needs psycopg2 (installed "
                               "by `make setup`); MySQL needs pymysql") from error
        except (ArgumentError, NoSuchModuleError) as error:
            raise RuntimeError(f"--storage {url}: not a database URL this can open ({error}); "
                               "pass sqlite:///PATH or postgresql+psycopg2://USER@HOST/DB"
                               ) from None
        except (OperationalError, ProgrammingError, IntegrityError) as error:
            # Workers started together on a new database race to create its tables ("table
            # ... already exists"); the loser finds them made on its next try.
            if attempt == STORAGE_ATTEMPTS - 1:
                reason = (str(getattr(error, "orig", None) or error).strip().splitlines()
                          or [type(error).__name__])[0]
                raise RuntimeError(f"--storage {url}: cannot open the database ({reason}); "
                                   "check its host, credentials and name, or the folder of "
                                   "a SQLite file") from None
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")

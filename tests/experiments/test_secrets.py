"""No storage password is printed or written: a sentinel password in the ``--storage`` URL
of `worker`, `grid` and `tune`, for runs that fail (each scheme, checked before anything is
planned) and runs that succeed on a PostgreSQL role with a password, must appear in none of
their output and none of the files they write.  The password may also come from
``PGPASSWORD``, a ``.pgpass`` file or ``?password_env=NAME``."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.experiments.storage import StorageError, check_storage, mask_url, scrub
from tests.experiments.test_grid import grid_suite
from tests.postgres_server import free_port

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

SENTINEL = "S3ntinel-pw-Q7"
ROLE, DATABASE = "harness_secret", "harness_secrets"
PASSWORD_VARIABLE = "HARNESS_TEST_DB_PASSWORD"


@pytest.fixture(scope="module")
def password_server(postgres_url) -> tuple[str, int]:
    """Host and port of the tests' server, where the role ``harness_secret`` (password
    SENTINEL, owner of the database ``harness_secrets``) must give its password: a
    scram-sha-256 rule for it goes before the server's trust rules."""
    import psycopg2
    from sqlalchemy.engine import make_url

    admin = make_url(postgres_url)
    connection = psycopg2.connect(host=admin.host, port=admin.port, user=admin.username,
                                  dbname=admin.database)
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,))
            if cursor.fetchone() is None:
                cursor.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD %s", (SENTINEL,))
                cursor.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
                cursor.execute("SHOW hba_file")
                hba = Path(cursor.fetchone()[0])
                rule = f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n"
                hba.write_text(rule + hba.read_text())
                cursor.execute("SELECT pg_reload_conf()")
    finally:
        connection.close()
    return admin.host, admin.port


@pytest.fixture
def no_password_sources(monkeypatch, tmp_path) -> None:
    """No password from the caller's environment or home, and temporary files under
    ``tmp_path/tmp``, where the leak check reads them."""
    for name in ("PGPASSWORD", "PGPASSFILE", PASSWORD_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


def _url(server: tuple[str, int], password: str | None = SENTINEL, query: str = "") -> str:
    host, port = server
    user = ROLE if password is None else f"{ROLE}:{password}"
    return f"postgresql+psycopg2://{user}@{host}:{port}/{DATABASE}{query}"


def _leaks(folder: Path, *outputs: str) -> list[str]:
    """Where SENTINEL appears: the outputs given, and every file under ``folder``."""
    places = [f"output {index}" for index, text in enumerate(outputs) if SENTINEL in text]
    places += [str(path) for path in folder.rglob("*")
               if path.is_file() and SENTINEL.encode() in path.read_bytes()]
    return places


def _invoke(capfd, args: list[str]):
    """Run the CLI; its output together with whatever reached the process's stdout and
    stderr file descriptors (libraries, threads)."""
    result = CliRunner().invoke(app, args)
    captured = capfd.readouterr()
    return result, result.output + captured.out + captured.err


@pytest.mark.e2e
@pytest.mark.parametrize(("url", "says"), [
    (f"postgresql+psycopg2://user:{SENTINEL}@127.0.0.1:{{port}}/db",
     "postgresql+psycopg2://user:***@127.0.0.1:{port}/db: cannot open the database "
     '(connection to server at "127.0.0.1", port {port} failed: Connection refused)'),
    (f"postgresql://user:{SENTINEL}@127.0.0.1:{{port}}/db",  # psycopg2, not "missing"
     "postgresql://user:***@127.0.0.1:{port}/db: cannot open the database (connection"),
    (f"postgresql+psycopg2://user@127.0.0.1:{{port}}/db?password={SENTINEL}",
     "postgresql+psycopg2://user@127.0.0.1:{port}/db?password=***: cannot open"),
    (f"postgresql+psycopg2://user:{SENTINEL}@x@127.0.0.1:{{port}}/db",  # an unescaped @
     "postgresql+psycopg2://***@127.0.0.1:{port}/db: not a database URL this can open"),
    (f"mysql://user:{SENTINEL}@127.0.0.1:{{port}}/db",
     "mysql://user:***@127.0.0.1:{port}/db: its database driver needs the Python module "
     "MySQLdb, which is not installed"),
    (f"nosuchdb://user:{SENTINEL}@host/db",
     "nosuchdb://user:***@host/db: not a database URL this can open (Can't load plugin: "
     "sqlalchemy.dialects:nosuchdb)"),
    ("sqlite:///{tmp}/no-such-folder/study.db",
     "sqlite:///{tmp}/no-such-folder/study.db: cannot open the database (no folder "
     "{tmp}/no-such-folder); check the folder of the SQLite file"),
], ids=["psycopg2", "postgresql", "query", "unescaped-at", "mysql", "unknown", "sqlite"])
def test_worker_refuses_a_storage_in_one_line_before_planning_and_shows_no_password(
        tmp_path, tiny_data_dir, tiny_teacher_dir, no_password_sources, capfd, url, says):
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["kd"], "tasks": ["rte"], "seeds": [1]})
    port = free_port()
    url, says = (text.format(port=port, tmp=tmp_path) for text in (url, says))
    result, output = _invoke(capfd, [
        "worker", "--storage", url, "--suite", str(path), "--results",
        str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 2, output
    assert output.strip().splitlines() == [output.strip()]  # one line: no plan, no traceback
    assert output.startswith(f"error: --storage {says}"), output
    assert _leaks(tmp_path, output) == []
    # nothing planned: no teacher trained, no cache made, nothing stored
    assert not (tmp_path / "results").exists() and not (tmp_path / "cache").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("command", [["grid"], ["tune", "--method", "kd", "--task", "rte"]])
def test_grid_and_tune_refuse_a_storage_before_planning(
        tmp_path, tiny_data_dir, tiny_teacher_dir, no_password_sources, monkeypatch, capfd,
        command):
    """... and mask it in ``sys.argv``, which trackers that record the command line read."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["kd"], "tasks": ["rte"], "seeds": [1]})
    url = f"postgresql+psycopg2://user:{SENTINEL}@127.0.0.1:{free_port()}/db"
    monkeypatch.setattr(sys, "argv", ["harness", *command, "--storage", url])
    result, output = _invoke(capfd, [
        *command, "--storage", url, "--suite", str(path), "--results",
        str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 2, output
    assert output.strip() == (f"error: --storage {mask_url(url)}: cannot open the database "
                              f"(connection to server at \"127.0.0.1\", port "
                              f"{url.rsplit(':', 1)[1].split('/')[0]} failed: Connection "
                              "refused); check its host, credentials and name, or the folder "
                              "of a SQLite file")
    assert _leaks(tmp_path, output) == []
    assert not (tmp_path / "cache").exists()
    assert sys.argv == ["harness", *command, "--storage", mask_url(url)]


def test_scrub_removes_the_password_as_written_decoded_or_taken_from_the_environment(
        monkeypatch):
    """What an error from a driver could quote: the URL, its password in either form, the
    password a variable holds."""
    escaped = SENTINEL.replace("-", "%2D")
    url = f"postgresql+psycopg2://{ROLE}:{escaped}@db.example.org/harness"
    text = scrub(f"failed: {url} (password {SENTINEL}, as written {escaped})", url)
    assert text == (f"failed: postgresql+psycopg2://{ROLE}:***@db.example.org/harness "
                    "(password ***, as written ***)")
    monkeypatch.setenv(PASSWORD_VARIABLE, SENTINEL)
    assert scrub(f"bad password {SENTINEL}",
                 f"postgresql://{ROLE}@h/db?password_env={PASSWORD_VARIABLE}") == (
        "bad password ***")
    unparsable = f"postgresql://{ROLE}:{SENTINEL}@x@h/db"
    assert scrub(f"cannot parse {unparsable}", unparsable) == "cannot parse postgresql://***@h/db"


def test_a_wrong_password_is_refused_without_showing_it(password_server, no_password_sources,
                                                        tmp_path):
    url = _url(password_server, f"{SENTINEL}-wrong")
    with pytest.raises(StorageError) as refused:
        check_storage(url)
    message = str(refused.value)
    assert message.startswith(f"--storage {mask_url(url)}: cannot open the database ("
                              "connection to server at"), message
    assert f'password authentication failed for user "{ROLE}"' in message
    assert SENTINEL not in message and refused.value.__suppress_context__
    assert SENTINEL not in mask_url(url)


@pytest.mark.parametrize("source", ["url", "PGPASSWORD", "pgpass", "PGPASSFILE",
                                    "password_env", "none"])
def test_the_password_comes_from_the_url_the_environment_or_a_file(
        password_server, no_password_sources, monkeypatch, tmp_path, source):
    host, port = password_server
    url = _url(password_server, SENTINEL if source == "url" else None,
               f"?password_env={PASSWORD_VARIABLE}" if source == "password_env" else "")
    line = f"{host}:{port}:{DATABASE}:{ROLE}:{SENTINEL}\n"
    if source == "PGPASSWORD":
        monkeypatch.setenv("PGPASSWORD", SENTINEL)
    elif source in {"pgpass", "PGPASSFILE"}:
        file = tmp_path / "home" / ".pgpass" if source == "pgpass" else tmp_path / "secret"
        file.parent.mkdir(exist_ok=True)
        file.write_text(line)
        file.chmod(0o600)  # libpq ignores a password file others can read
        if source == "PGPASSFILE":
            monkeypatch.setenv("PGPASSFILE", str(file))
    elif source == "password_env":
        monkeypatch.setenv(PASSWORD_VARIABLE, SENTINEL)
    if source == "none":
        with pytest.raises(StorageError, match="no password supplied"):
            check_storage(url)
    else:
        check_storage(url)


def test_password_env_names_a_variable_that_must_be_set(no_password_sources):
    url = f"postgresql+psycopg2://{ROLE}@127.0.0.1:1/db?password_env={PASSWORD_VARIABLE}"
    with pytest.raises(StorageError, match=f"the environment variable {PASSWORD_VARIABLE} "
                                           "is not set"):
        check_storage(url)
    both = f"postgresql+psycopg2://{ROLE}:{SENTINEL}@127.0.0.1:1/db?password_env=X"
    with pytest.raises(StorageError, match="give the password one way") as refused:
        check_storage(both)
    assert SENTINEL not in str(refused.value)


@pytest.mark.e2e
def test_a_worker_that_tunes_and_trains_with_a_password_prints_and_writes_it_nowhere(
        password_server, no_password_sources, tmp_path, tiny_data_dir, tiny_teacher_dir,
        capfd):
    """A grid with a tuning budget: the worker logs its study and queue, writes the
    tuned-study file (meant to be committed) and the cell's record, all without the
    password; its cache, logs and temporary files hold none either."""
    path = grid_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                      {"methods": ["kd"], "tasks": ["rte"], "seeds": [1],
                       "budget": {"tuning_trials": 1}})
    url = _url(password_server)
    worker, output = _invoke(capfd, [
        "worker", "--storage", url, "--poll-seconds", "0.5", "--suite", str(path),
        "--results", str(tmp_path / "results"), "--cache-dir", str(tmp_path / "cache")])
    assert worker.exit_code == 0, output
    masked = mask_url(url)
    assert masked == url.replace(SENTINEL, "***")
    assert f"on {masked}" in output and "1 of 1 cells complete" in output
    [tuned] = (tmp_path / "results" / "tuned").glob("*.yaml")
    assert yaml.safe_load(tuned.read_text())["storage"] == masked
    assert list((tmp_path / "results" / "tiny").rglob("*.json"))  # the cell's record
    assert _leaks(tmp_path, output) == []

"""A throw-away PostgreSQL server on loopback, for tests and local scripts.

`start_postgres()` creates a fresh cluster in a temporary directory (trust authentication,
superuser `postgres`, UTF8, no fsync), starts it on a free TCP port of 127.0.0.1 with its unix
socket in that directory, creates one database and returns its SQLAlchemy URL together with a
callable that stops the server and removes the directory. `postgres_server()` is the same as a
context manager (the `postgres_url` fixture in conftest.py uses it).

PostgreSQL refuses to run as root: under euid 0 the server programs run as the `postgres` system
user (created by the Debian package) through `runuser`, and the directory is handed to that user.
The binaries come from /usr/lib/postgresql/<highest version>/bin or PATH; `make setup` installs
the Debian package `postgresql` when neither has them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

DEFAULT_DBNAME = "harness_test"
SUPERUSER = "postgres"
RUN_AS = "postgres"  # the system user that runs the server when we are root
_SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",  # a throw-away cluster: durability buys nothing, costs seconds
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "100",
    "logging_collector": "off",
}


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries (or the user to run them as) are missing."""


def find_pg_bin() -> Path:
    """The directory holding initdb and pg_ctl: the highest /usr/lib/postgresql/N/bin, else
    wherever PATH finds them (symlinks followed)."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", path.parent.name))

    candidates = sorted(
        (p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")),
        key=version,
        reverse=True,
    )
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bin_dir in candidates:
        if all(os.access(bin_dir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return bin_dir
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found under "
        "/usr/lib/postgresql/*/bin or on PATH: run `make setup`, which installs the Debian "
        "package `postgresql` (or `apt-get install postgresql` as root)."
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env() -> dict[str, str]:
    # PG* variables (PGDATA, PGPORT, PGHOST...) of the caller must not steer our cluster, and an
    # unknown locale in the environment makes initdb and the server complain.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    return env


class _Server:
    def __init__(self, dbname: str, timeout: float) -> None:
        self.bin_dir = find_pg_bin()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            try:
                self.user = pwd.getpwnam(RUN_AS)
            except KeyError:
                raise PostgresUnavailable(
                    f"PostgreSQL refuses to run as root and there is no `{RUN_AS}` system user "
                    "to run it as: install the Debian package `postgresql` (`make setup`)."
                ) from None
            if not shutil.which("runuser"):
                raise PostgresUnavailable("running PostgreSQL as root needs `runuser` (util-linux)")
        self.dbname = dbname
        self.timeout = timeout
        self.env = _child_env()
        # Our own directory under /tmp when root: pytest's and $TMPDIR's may not be traversable
        # by the `postgres` user (/tmp/pytest-of-root is 0700).
        tmp_parent = "/tmp" if self.as_root else None
        self.root = Path(tempfile.mkdtemp(prefix="harness-pg-", dir=tmp_parent))
        if self.as_root:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self.started = False
        self.watchdog: subprocess.Popen | None = None
        self.startup_seconds = 0.0  # initdb + start + CREATE DATABASE

    def _cmd(self, program: str, *args: str) -> list[str]:
        cmd = [str(self.bin_dir / program), *args]
        return ["runuser", "-u", RUN_AS, "--", *cmd] if self.as_root else cmd

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = self._cmd(*args)
        proc = subprocess.run(
            cmd, cwd=self.root, env=self.env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=self.timeout + 30,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
                + self._log_tail()
            )
        return proc

    def _log_tail(self) -> str:
        try:
            return "\nserver log:\n" + self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                  "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions")
        settings = {**_SERVER_SETTINGS, "unix_socket_directories": f"'{self.root}'"}
        conf = "".join(f"{k} = {v}\n" for k, v in settings.items())
        # The port is not here: it goes on the command line at each start attempt.
        with open(self.data / "postgresql.conf", "a") as f:  # owned by RUN_AS; we are root
            f.write("\n# tests/postgres_server.py\n" + conf)

    def start(self, attempts: int = 3) -> None:
        # The free port can be taken between our probe and the server's bind: try a few.
        for attempt in range(attempts):
            self.port = free_port()
            proc = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
                             "-t", str(int(self.timeout)), "-o", f"-p {self.port}", "start",
                             check=False)
            if proc.returncode == 0:
                self.started = True
                self._start_watchdog()
                return
            if attempt == attempts - 1 or "Address already in use" not in self._log_tail():
                raise RuntimeError(f"pg_ctl start failed:\n{proc.stdout}{proc.stderr}"
                                   + self._log_tail())

    def _start_watchdog(self) -> None:
        # A process killed outright (SIGKILL, a CI timeout) runs no atexit hook and would leave
        # the server running: a detached shell stops it once this process is gone.
        script = ('p=$1; d=$2; shift 2; while kill -0 "$p" 2>/dev/null; do sleep 1; done; '
                  '"$@" >/dev/null 2>&1; rm -rf "$d"')
        stop = self._cmd("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.watchdog = subprocess.Popen(
            ["sh", "-c", script, "pg-watchdog", str(os.getpid()), str(self.root), *stop],
            cwd="/", env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def create_database(self) -> None:
        import psycopg2  # a main dependency; imported here so the module loads without it

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=SUPERUSER,
                                dbname="postgres", connect_timeout=int(self.timeout))
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{self.dbname}"')
        finally:
            conn.close()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{self.dbname}"

    def stop(self) -> None:
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
            self.watchdog = None
        try:
            if self.started:
                self.started = False
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop",
                          check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start_postgres(
    dbname: str = DEFAULT_DBNAME, *, timeout: float = 60.0
) -> tuple[str, Callable[[], None]]:
    """Start a throw-away server and create `dbname` on it. Returns (SQLAlchemy URL, stop): call
    stop() to shut the server down (immediate mode) and delete its files; it is idempotent and
    also runs at interpreter exit. Raises PostgresUnavailable when the binaries are missing."""
    server = _Server(dbname, timeout)
    done = False

    def stop() -> None:
        nonlocal done
        if not done:
            done = True
            atexit.unregister(stop)
            server.stop()

    atexit.register(stop)
    try:
        t0 = time.perf_counter()
        server.init()
        server.start()
        server.create_database()
        server.startup_seconds = time.perf_counter() - t0
    except BaseException:
        stop()
        raise
    stop.server = server  # type: ignore[attr-defined]  # port, data dir, log for debugging
    return server.url, stop


@contextlib.contextmanager
def postgres_server(dbname: str = DEFAULT_DBNAME, *, timeout: float = 60.0) -> Iterator[str]:
    """start_postgres() as a context manager: yields the URL, stops the server on exit."""
    url, stop = start_postgres(dbname, timeout=timeout)
    try:
        yield url
    finally:
        stop()


if __name__ == "__main__":  # python tests/postgres_server.py: start one, print its URL, wait
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that atexit stops the server
    url, stop = start_postgres()
    print(url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop()

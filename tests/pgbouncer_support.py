"""A real PgBouncer in front of the machine's PostgreSQL, for the ``postgresql-pgbouncer`` driver (tests/drivers.py).

Debian's ``pgbouncer`` (``make test`` installs it as root, like Chromium), started once per test run on a free
loopback port, each database alias in the pool mode it is made with (``pool_mode`` per database): **transaction
mode** by default, where each transaction of a client may run on another server connection, so nothing of a
session survives between transactions (no ``LISTEN``, no prepared-statement cache, no ``SET``); or **session
mode**, where a client keeps its server connection until it disconnects (``LISTEN`` works).
PgBouncer forwards no per-client ``search_path``, and the suite's app tables (an effect's ``effects``) resolve
through it: so each test's schema gets a login role of its own whose default ``search_path`` is that schema
(``ALTER ROLE … SET``: what a server connection goes back to after asyncpg's ``RESET ALL`` on release, which a
``SET`` at connect would not survive), and a database alias that logs in as that role, added to the configuration
and loaded with ``SIGHUP``. The role is dropped after the test. The server
configuration is Debian's defaults otherwise: no ``ignore_startup_parameters``, so asyncq must send no startup
setting PgBouncer refuses (behind a pooler, ``?pooler=…``, it sends only ``application_name``, and reads
``synchronous_commit`` back on every new connection: the server's default is ``on``).

PgBouncer refuses to run as root: as root it runs as the ``postgres`` user (``runuser``), its files in a folder
of its own under the system's temporary directory.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pg_cluster_support import SERVER_USER, free_port
from postgres_support import SERVER_URL, execute
from rabbit_support import unavailable

BINARY = "/usr/sbin/pgbouncer"


def bouncer_problem() -> str | None:
    """Why this machine cannot start a PgBouncer (``None``: it can)."""
    if not os.path.exists(BINARY):
        return f"no PgBouncer at {BINARY} (Debian's pgbouncer package; make test installs it as root)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root, and PgBouncer refuses root: no {SERVER_USER!r} user to run it as"
        if shutil.which("runuser") is None:
            return "running as root without runuser: cannot start PgBouncer as another user"
    return None


INI = """[databases]
{databases}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pidfile = {folder}/pgbouncer.pid
logfile = {folder}/pgbouncer.log
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
"""


@dataclass
class Bouncer:
    """A running PgBouncer: its port, and the aliases it serves (``alias`` adds one)."""

    folder: Path
    port: int
    server_host: str
    server_port: int
    process: subprocess.Popen[bytes] | None = None
    aliases: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # alias: (database, role, pool mode)

    def url(self, alias: str, **options: str) -> str:
        query = "&".join(f"{name}={value}" for name, value in options.items())
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{alias}" + (f"?{query}" if query else "")

    def alias(self, name: str, database: str, role: str, mode: str = "transaction") -> str:
        """A database alias ``name`` for ``database``, logging in to the server as ``role``, pooled in ``mode``
        (``transaction`` or ``session``), loaded."""
        self.aliases[name] = (database, role, mode)
        self._write()
        self._reload()
        self._wait_for(name)
        return name

    def _wait_for(self, alias: str) -> None:
        """Until PgBouncer serves ``alias`` (it loads a configuration a moment after ``SIGHUP``)."""
        import asyncpg
        from postgres_support import run_in_thread

        async def answers() -> bool:
            try:
                conn = await asyncpg.connect(self.url(alias), timeout=5, statement_cache_size=0)
            except asyncpg.PostgresError as error:
                if "no such database" in str(error):
                    return False
                raise
            await conn.close()
            return True

        deadline = time.monotonic() + 10
        while not run_in_thread(answers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PgBouncer did not load the alias {alias}")
            time.sleep(0.01)

    def drop(self, alias: str) -> None:
        self.aliases.pop(alias, None)
        self._write()
        self._reload()

    def _write(self) -> None:
        lines = [
            f"{alias} = host={self.server_host} port={self.server_port} dbname={database} user={role} pool_mode={mode}"
            for alias, (database, role, mode) in self.aliases.items()
        ]
        fresh = self.folder / "pgbouncer.ini.new"
        fresh.write_text(INI.format(databases="\n".join(lines), port=self.port, folder=self.folder))
        os.chmod(fresh, 0o644)
        os.replace(fresh, self.folder / "pgbouncer.ini")

    def _pid(self) -> int:
        return int((self.folder / "pgbouncer.pid").read_text().strip())

    def _reload(self) -> None:
        if self.process is not None:
            os.kill(self._pid(), signal.SIGHUP)

    def start(self) -> None:
        self._write()
        (self.folder / "users.txt").write_text(f'"{SERVER_USER}" ""\n')
        command = [BINARY, str(self.folder / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not (self.folder / "pgbouncer.pid").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.folder / "pgbouncer.log"
                raise RuntimeError(f"PgBouncer did not start: {log.read_text()[-2000:] if log.exists() else ''}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError, ValueError):
                os.kill(self._pid(), signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            if self.process.poll() is None:
                self.process.kill()
            self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def schema_alias(bouncer: Bouncer, url: str, schema: str, mode: str = "transaction") -> AsyncIterator[str]:
    """A PgBouncer alias for ``schema`` of the database ``url`` names, pooled in ``mode`` and logging in as a role of
    its own whose default ``search_path`` is the schema (the alias is named ``schema``, ``{schema}_s`` in session
    mode); the schema (with everything in it), the role and the alias go at the end."""
    server, database, role = url.split("?")[0], urlsplit(url).path.lstrip("/"), f"asyncq_{schema}"
    await execute(server, f"CREATE ROLE {role} LOGIN")
    try:
        await execute(server, f"GRANT CREATE, CONNECT ON DATABASE {database} TO {role}")
        await execute(server, f"ALTER ROLE {role} SET search_path = {schema}")
        alias = bouncer.alias(schema if mode == "transaction" else f"{schema}_s", database, role, mode)
        try:
            yield alias
        finally:
            bouncer.drop(alias)
            await execute(server, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await execute(server, f"DROP OWNED BY {role}")
        await execute(server, f"DROP ROLE {role}")


_running: list[Bouncer] = []


def running_bouncer(server_url: str) -> Bouncer:
    """This run's PgBouncer in front of ``server_url``'s server, started on first use, stopped at exit."""
    if _running:
        return _running[0]
    server = urlsplit(server_url)
    folder = Path(tempfile.mkdtemp(prefix="asyncq-pgbouncer-"))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SERVER_USER)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    os.chmod(folder, 0o755)
    bouncer = Bouncer(folder, free_port("127.0.0.1"), server.hostname or "127.0.0.1", server.port or 5432)
    bouncer.start()
    _running.append(bouncer)
    atexit.register(bouncer.stop)
    return bouncer


@pytest.fixture(scope="session")
def pgbouncer() -> Bouncer:
    """This run's PgBouncer (skip with the reason, or fail under ``CI=true``, if it cannot run here)."""
    problem = bouncer_problem()
    if problem is not None:
        unavailable(problem)
    return running_bouncer(SERVER_URL)

"""A PostgreSQL cluster a test or a benchmark owns (the chaos harness's ``--store postgresql``, the tests through
``tests/pg_cluster_support.py``): ``initdb`` into a temporary folder, ``pg_ctl start`` on the addresses the test
names (a bridge's, in tests/test_many_hosts.py), trust authentication for the networks it names, stopped and
removed at the end even when the test fails.

The server binaries come from Debian's versioned folder (``/usr/lib/postgresql/<version>/bin``, outside ``PATH``;
``ASYNCQ_PG_BIN`` names another). ``initdb`` refuses to run as root, so as root the cluster belongs to the
``postgres`` user (``runuser``) and lives in a folder of its own under the system's temporary directory (a
pytest ``tmp_path`` is root's only). The server runs with asyncq's durable settings: ``fsync`` and
``synchronous_commit`` on.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (``ASYNCQ_PG_BIN``, else Debian's newest), or ``None``."""
    named = os.environ.get("ASYNCQ_PG_BIN")
    candidates = [Path(named)] if named else sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def cluster_problem() -> str | None:
    """Why this machine cannot start a cluster of the test's own (``None``: it can)."""
    if server_binaries() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or ASYNCQ_PG_BIN"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root, and initdb refuses root: no {SERVER_USER!r} user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root without runuser: cannot start the server as another user"
    return None


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Cluster:
    """A running cluster: where it listens, and the URL of its ``postgres`` database."""

    folder: Path
    address: str
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SERVER_USER}@{self.address}:{self.port}/{database}"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def stop(self) -> None:
        """Stop the server (fast shutdown); ``start`` brings it back on the same port."""
        _stop(self._binaries(), self.folder / "data")

    def start(self) -> None:
        """Start the stopped server; returns once it accepts connections."""
        _run([str(self._binaries() / "pg_ctl"), "-D", str(self.folder / "data"), "-l", str(self.log), "-w", "-t",
              "60", "start"], 90)  # fmt: skip

    def _binaries(self) -> Path:
        binaries = server_binaries()
        assert binaries is not None
        return binaries

    def postmaster_pid(self) -> int:
        """The running postmaster's pid (the first line of ``postmaster.pid``)."""
        return int((self.folder / "data" / "postmaster.pid").read_text().split("\n", 1)[0])

    def kill(self) -> None:
        """SIGKILL the postmaster, then every backend it leaves (``pg_ctl stop -m immediate`` would still ask them
        to quit: this is the power cut a process can do), and wait until none of them runs. ``start`` recovers
        from the WAL."""
        postmaster = self.postmaster_pid()
        children = _children(postmaster)
        for pid in [postmaster, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in [postmaster, *children]:
            _wait_gone(pid)
        # A killed postmaster may stay a zombie a while (this machine's pid 1 may not reap orphans), and a zombie's
        # pid still answers kill(pid, 0): the next start would take the lock files for a live server's. Every
        # process of the server is dead, so they are stale.
        (self.folder / "data" / "postmaster.pid").unlink(missing_ok=True)
        for lock in self.folder.glob(f".s.PGSQL.{self.port}*"):
            lock.unlink(missing_ok=True)

    def crash_restart(self) -> None:
        """``pg_ctl restart -m immediate``: every backend killed without a checkpoint (as a crash), the server
        recovering from its WAL on the way back up; returns once it accepts connections again."""
        pg_ctl = [str(self._binaries() / "pg_ctl"), "-D", str(self.folder / "data"), "-l", str(self.log)]
        _run([*pg_ctl, "-m", "immediate", "-w", "-t", "60", "restart"], 90)


def _as_server_user(command: Sequence[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *command] if os.geteuid() == 0 else list(command)


def _run(command: Sequence[str], timeout: float = 60) -> None:
    done = subprocess.run(_as_server_user(command), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{Path(command[0]).name} failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}"
        )


HBA = """local all all trust
host all all 127.0.0.1/32 trust
{networks}
"""


def _configure(data: Path, address: str, port: int, folder: Path, trusted: Sequence[str]) -> None:
    networks = "\n".join(f"host all all {network} trust" for network in trusted)
    (data / "pg_hba.conf").write_text(HBA.format(networks=networks))
    settings = {
        "listen_addresses": f"'{address}'",
        "port": str(port),
        "unix_socket_directories": f"'{folder}'",
        "fsync": "on",
        "synchronous_commit": "on",
        "max_connections": "100",
        "shared_buffers": "'64MB'",
    }
    with open(data / "postgresql.conf", "a") as conf:
        conf.write("".join(f"{name} = {value}\n" for name, value in settings.items()))


@contextlib.contextmanager
def running_cluster(address: str, trusted: Sequence[str] = ()) -> Iterator[Cluster]:
    """A fresh cluster listening on ``address`` (a free port), trusting local connections and ``trusted``
    networks; stopped (fast, then immediate) and its folder removed when the block ends, however it ends."""
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError(cluster_problem() or "no server binaries")
    folder = Path(tempfile.mkdtemp(prefix="asyncq-cluster-"))
    data = folder / "data"
    try:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        # --no-sync: only initdb's own final flush is skipped; the server then runs with fsync on.
        _run([str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", SERVER_USER, "-E", "UTF8", "--no-sync"])
        port = free_port(address)
        _configure(data, address, port, folder, trusted)
        cluster = Cluster(folder, address, port)
        _run([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(cluster.log), "-w", "-t", "60", "start"], 90)
        try:
            yield cluster
        finally:
            _stop(binaries, data)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stop(binaries: Path, data: Path) -> None:
    """Stop the server: fast shutdown (ends its connections), immediate if that does not end in time; nothing if
    it is not running (a test killed it and failed before starting it again)."""
    if not (data / "postmaster.pid").exists():
        return
    try:
        _run([str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop"], 45)
    except (RuntimeError, subprocess.TimeoutExpired):
        _run([str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"], 45)


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    """Poll until process ``pid`` is gone or a zombie (its parent reaps it); a ``TimeoutError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} still runs {timeout} s after SIGKILL")

"""The processes of tests/test_many_hosts.py: the receiver (``python -m asyncq.inbox`` on its SQLite inbox, with the
``stock`` effect) on the server side, and one worker process per host (``many_hosts_worker.py``), each SIGKILLed
and restarted under a new owner name on demand. Every process dies with the test (PR_SET_PDEATHSIG) and is ended
when the blocks below end, however they end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waiting import eventually_sync

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "many_hosts_worker.py"
# ``python -m asyncq.inbox`` that gets SIGTERM when the test's process dies.
RECEIVER = (
    "import ctypes, runpy, signal; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "runpy.run_module('asyncq.inbox', run_name='__main__', alter_sys=True)"
)


def child_env() -> dict[str, str]:
    """This environment with the checkout first on ``PYTHONPATH`` (children import this ``asyncq``)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except FileNotFoundError:
        return ""


def terminate(process: subprocess.Popen[Any]) -> None:
    """SIGTERM ``process`` if it runs (SIGCONT first: a stopped process cannot act on it)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            process.terminate()


def wait_or_kill(process: subprocess.Popen[Any], timeout: float) -> int:
    """Wait ``timeout`` s for ``process`` told to stop (once: a second SIGTERM could land after it removed its
    handler), then SIGKILL it; its exit code."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@contextlib.contextmanager
def running_receiver(db: Path, address: str) -> Iterator[str]:
    """The receiver listening on ``address`` (a free port), its inbox in ``db``; its URL. Stopped with SIGTERM
    when the block ends (its inbox file is then complete)."""
    command = [sys.executable, "-c", RECEIVER, "--db", str(db), "--host", address, "--effect", "stock"]
    errors = db.with_suffix(".stderr")
    with open(errors, "ab") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=child_env())
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the receiver did not start: {tail(errors)}")
        yield url
    finally:
        terminate(process)
        code = wait_or_kill(process, 15)
        if process.stdout is not None:
            process.stdout.close()
    if code != 0:
        raise RuntimeError(f"the receiver exited with {code}: {tail(errors)}")


@dataclass
class Host:
    """One worker host: its slot, its current process and its owner name (``h<index>-<generation>``)."""

    index: int
    generation: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def owner(self) -> str:
        return f"h{self.index}-{self.generation}"


@dataclass
class Fleet:
    """The worker hosts. ``command(index, argv)`` runs ``argv`` on host ``index`` (in its namespace, or as is)."""

    folder: Path
    command: Callable[[int, Sequence[str]], list[str]]
    worker_args: list[str]
    hosts: list[Host] = field(default_factory=list)
    kills: int = 0
    #: (owner, exit code) of every process that ended without being killed by the test.
    exits: list[tuple[str, int]] = field(default_factory=list)

    def status_file(self, owner: str) -> Path:
        return self.folder / f"{owner}.json"

    def stderr_file(self, index: int) -> Path:
        return self.folder / f"host-{index}.stderr"

    def start_all(self, count: int) -> None:
        self.hosts = [Host(index) for index in range(count)]
        for host in self.hosts:
            self.start(host)

    def start(self, host: Host) -> None:
        """Start the host's next worker process, under a new owner name."""
        host.generation += 1
        argv = [sys.executable, str(WORKER), *self.worker_args, "--owner", host.owner]
        argv += ["--status", str(self.status_file(host.owner))]
        with open(self.stderr_file(host.index), "ab") as stderr:
            host.process = subprocess.Popen(self.command(host.index, argv), stderr=stderr, env=child_env())

    def kill_and_restart(self, host: Host) -> None:
        """SIGKILL the host's worker, reap it, start its successor."""
        assert host.process is not None
        if host.process.poll() is not None:  # it ended by itself: say so at the end
            self.exits.append((host.owner, host.process.returncode))
        else:
            host.process.kill()
            host.process.wait()
            self.kills += 1
        self.start(host)

    def status(self, owner: str) -> dict[str, Any]:
        """What owner's process last wrote of its counters (``{}`` before its first write)."""
        try:
            return json.loads(self.status_file(owner).read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def self_exits(self) -> list[tuple[str, int]]:
        """Processes that exited while the test had not stopped them (a crash), with their exit codes."""
        running = [(host.owner, host.process.poll()) for host in self.hosts if host.process is not None]
        return self.exits + [(owner, code) for owner, code in running if code is not None]

    def stop_all(self, timeout: float = 20) -> list[tuple[str, int]]:
        """SIGTERM every worker once it serves (its first status written: a process still starting up would die
        of the signal), and each finishes its jobs in flight; each one's owner and exit code."""
        processes = [(host.owner, host.process) for host in self.hosts if host.process is not None]
        try:  # one that exited already is the test's to report (self_exits)
            eventually_sync(
                lambda: all(self.status(owner) or process.poll() is not None for owner, process in processes),
                "every worker to serve (its first status written)",
                timeout=timeout,
            )
        finally:
            for _owner, process in processes:
                terminate(process)
        codes = [(owner, wait_or_kill(process, timeout)) for owner, process in processes]
        for host in self.hosts:
            host.process = None
        return codes


@contextlib.contextmanager
def running_fleet(fleet: Fleet, count: int) -> Iterator[Fleet]:
    """``count`` worker hosts started; every one still running is SIGKILLed when the block ends."""
    try:
        fleet.start_all(count)
        yield fleet
    finally:
        for host in fleet.hosts:
            if host.process is not None and host.process.poll() is None:
                host.process.kill()
                host.process.wait()

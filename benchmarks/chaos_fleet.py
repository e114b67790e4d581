"""The chaos harness's processes: worker slots and the inbox receiver, started, killed, stopped and restarted.

Each worker slot runs one process at a time under a fresh owner name (``w<slot>-<generation>``), so the leases
a killed process leaves behind are told apart from its successor's. A process that exits without being killed
(a crash, such as "database is locked") is counted with the last line of its stderr and restarted.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import chaos_worker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# ``python -m asyncq.inbox``, and SIGTERM when the harness dies (prctl PR_SET_PDEATHSIG), so no receiver outlives it.
RECEIVER = (
    "import ctypes, runpy, signal; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "runpy.run_module('asyncq.inbox', run_name='__main__', alter_sys=True)"
)
# Workers are forked from a server that has imported them once (``Forked``).
FORK_SERVER = multiprocessing.get_context("forkserver")
FORK_SERVER.set_forkserver_preload(["__main__", "chaos_worker"])
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)")


def child_env() -> dict[str, str]:
    """This environment with the checkout first on ``PYTHONPATH`` (children import this ``asyncq``)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def last_line(path: Path) -> str:
    """The last line of a text file that names an exception (``sqlite3.OperationalError: …``), with a
    traceback's group decorations stripped; else its last non-empty line ('' if none)."""
    try:
        lines = [line.strip(" \t|+-") for line in path.read_text(errors="replace").splitlines()]
    except FileNotFoundError:
        return ""
    lines = [line for line in lines if line]
    errors = [line for line in lines if EXCEPTION_LINE.match(line)]
    return (errors or lines or [""])[-1]


def wait_stopped(pid: int, timeout: float = 5.0) -> bool:
    """Poll ``/proc`` until ``pid`` is in the stopped state (``T``): a SIGSTOP is delivered asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                    return True
        except FileNotFoundError:  # it died (and was reaped) meanwhile
            return False
        time.sleep(0.001)
    return False


@dataclass
class SelfExit:
    """A process that exited on its own."""

    who: str
    code: int | None
    last_stderr: str


class Forked:
    """A worker process forked by the fork server, with ``subprocess.Popen``'s methods the fleet uses.

    The fork server has imported ``chaos_worker`` (asyncq, aiohttp) once: a restart is a fork, not a new
    interpreter importing everything again (0.4 CPU-seconds each, which at up to four kills a second would take
    most of one of the two cores the harness is sized for)."""

    def __init__(self, argv: list[str], stderr: Path) -> None:
        arguments = (argv, str(stderr), os.getpid())
        self._process = FORK_SERVER.Process(target=chaos_worker.forked_main, args=arguments, daemon=True)
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("worker", timeout or 0)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def terminate(self) -> None:
        self._process.terminate()


@dataclass
class Slot:
    """One worker slot: its current process and owner name."""

    index: int
    generation: int = 0
    process: Forked | None = None

    @property
    def owner(self) -> str:
        return f"w{self.index}-{self.generation}"


@dataclass
class WorkerOptions:
    """How every worker process runs its pool."""

    store: str
    queue: str
    events: Path
    concurrency: int
    lease_ms: int


@dataclass
class Fleet:
    """The worker processes and the receiver of one run, in ``folder`` (stderr files, the inbox file)."""

    folder: Path
    options: WorkerOptions
    slots: list[Slot] = field(default_factory=list)
    self_exits: list[SelfExit] = field(default_factory=list)
    receiver: subprocess.Popen[str] | None = None
    url: str = ""
    port: int = 0

    @property
    def inbox(self) -> Path:
        return self.folder / "inbox.db"

    # -- the receiver -------------------------------------------------------------------------------------

    def start_receiver(self, attempts: int = 50) -> None:
        """Start the project's receiver (``python -m asyncq.inbox``, its ``stock`` effect): on a free port the
        first time, on the same port after (the workers keep their URL); a port not free yet is tried again."""
        for _ in range(attempts):
            command = [sys.executable, "-c", RECEIVER, "--db", str(self.inbox), "--effect", "stock"]
            command += ["--port", str(self.port)]
            with open(self.folder / "receiver.stderr", "ab") as errors:
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, env=child_env())
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            if url.startswith("http://"):
                self.receiver, self.url = process, url
                self.port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
                return
            process.wait()
            time.sleep(0.05)  # the old listener's port is not free yet: try again shortly
        raise RuntimeError(f"the receiver did not start: {last_line(self.folder / 'receiver.stderr')}")

    def kill_receiver(self) -> None:
        """SIGKILL the receiver and reap it (``start_receiver`` runs its successor)."""
        assert self.receiver is not None
        self.receiver.kill()
        self.receiver.wait()
        if self.receiver.stdout is not None:
            self.receiver.stdout.close()
        self.receiver = None

    # -- workers ------------------------------------------------------------------------------------------

    def start_workers(self, count: int) -> None:
        self.slots = [Slot(index) for index in range(count)]
        for slot in self.slots:
            self.start(slot)

    def start(self, slot: Slot) -> None:
        """Start the slot's next process under a new owner name."""
        slot.generation += 1
        options = self.options
        argv = ["--store", options.store, "--queue", options.queue, "--url", self.url, "--owner", slot.owner]
        argv += ["--events", str(options.events), "--concurrency", str(options.concurrency)]
        argv += ["--lease-ms", str(options.lease_ms)]
        slot.process = Forked(argv, self.folder / f"worker-{slot.index}.stderr")

    def kill(self, slot: Slot) -> None:
        """SIGKILL the slot's process and reap it (``start`` runs its successor)."""
        assert slot.process is not None
        slot.process.kill()
        slot.process.wait()

    def pids(self) -> dict[int, Slot]:
        return {slot.process.pid: slot for slot in self.slots if slot.process is not None}

    def restart_exited(self) -> int:
        """Count and restart every process that exited on its own since the last call; how many did."""
        exited = 0
        for slot in self.slots:
            code = None if slot.process is None else slot.process.poll()
            if code is not None:
                line = last_line(self.folder / f"worker-{slot.index}.stderr")
                self.self_exits.append(SelfExit(slot.owner, code, line))
                self.start(slot)
                exited += 1
        if self.receiver is not None and self.receiver.poll() is not None:
            line = last_line(self.folder / "receiver.stderr")
            self.self_exits.append(SelfExit("receiver", self.receiver.returncode, line))
            self.start_receiver()
            exited += 1
        return exited

    # -- the end ------------------------------------------------------------------------------------------

    def stop_all(self, timeout: float = 30.0) -> list[SelfExit]:
        """SIGTERM the workers, then (once they are gone) the receiver; how each one exited (a worker
        killed after ``timeout``, if it had not)."""
        ends: list[SelfExit] = []
        workers = [(s.owner, s.process, self.folder / f"worker-{s.index}.stderr") for s in self.slots if s.process]
        for group in (workers, [("receiver", self.receiver, self.folder / "receiver.stderr")]):
            for _who, process, _errors in group:
                if process is not None and process.poll() is None:
                    os.kill(process.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                    process.terminate()
            for who, process, errors in group:
                if process is not None:
                    code = terminate_wait(process, timeout)
                    ends.append(SelfExit(who, code, last_line(errors) if code else ""))
        return ends


def terminate_wait(process: Forked | subprocess.Popen[str], timeout: float) -> int:
    """Wait for a process told to stop; SIGKILL it after ``timeout`` seconds. Its exit code."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()

"""Drives ``examples/ticket_desk`` as a learner would: real child processes (site, worker, desk) on a store
of the test's own and a queue of the test's own, with output read line by line against a deadline.

Each desk runs in a copy of the folder in the test's ``tmp_path``, so ``desk.py reset`` and the lesson's
``cat > handler.py`` never touch the checkout. ``ASYNCQ_TICKET_DESK_SOURCE`` names another folder to copy
(e.g. an older commit's, to see a new test fail there)."""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest
from rabbit_support import QUEUE_EXPIRES_MS, queue_counts, unique_queue
from waiting import eventually_sync

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ticket_desk"
SOURCE = Path(os.environ.get("ASYNCQ_TICKET_DESK_SOURCE") or EXAMPLE)
STEP_TIMEOUT = 30.0
LEFT_BEHIND = ("__pycache__", "*.db", "*.db-*", "*.before-reset*")  # a learner's files, not the example's


def import_example(name: str) -> ModuleType:
    """Import one of the example's modules (they import each other by plain name, from their folder)."""
    if str(SOURCE) not in sys.path:
        sys.path.insert(0, str(SOURCE))
    return importlib.import_module(name)


def copy_example(destination: Path) -> Path:
    """The example's files copied to ``destination``; fails if ``handler.py`` is not the shipped one."""
    shutil.copytree(SOURCE, destination, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    handler = (destination / "handler.py").read_text()
    for earlier in ("handler_ack_first.py", "handler_no_key.py"):
        if handler == (destination / earlier).read_text():
            pytest.fail(
                f"{SOURCE / 'handler.py'} is {earlier}, not the shipped safe handler (desk.py reset or a lesson "
                "step replaced it): git checkout examples/ticket_desk/handler.py",
                pytrace=False,
            )
    return destination


class Child:
    """A child process whose stdout is read by a thread into a queue of lines."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            args, cwd=cwd, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def expect(self, text: str, timeout: float = STEP_TIMEOUT) -> str:
        """Wait for a line starting with ``text``; fail at the deadline or when stdout ends."""
        while True:
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"no line {text!r} within {timeout} s; got {self.lines}")
            if line is None:
                pytest.fail(f"stdout ended before {text!r}; got {self.lines}; stderr: {self.stderr()}")
            self.lines.append(line)
            if line.startswith(text):
                return line

    def send_enter(self) -> None:
        """Press Enter: a newline through the real stdin pipe."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def interrupt(self) -> int:
        """Ctrl+C as a real SIGINT; return the exit status."""
        self.process.send_signal(signal.SIGINT)
        return self.wait()

    def wait(self, timeout: float = STEP_TIMEOUT) -> int:
        """Wait for the exit, collecting the remaining stdout lines."""
        code = self.process.wait(timeout=timeout)
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return code

    def stderr(self) -> str:
        """What the child wrote to stderr (once it has exited)."""
        if self.process.poll() is None or self.process.stderr is None:
            return "(still running)"
        return self.process.stderr.read()

    def end(self) -> str:
        """SIGTERM, wait for the exit, and return what the child wrote to stderr."""
        self.process.terminate()
        self.wait()
        return self.stderr()

    def stop(self) -> None:
        """End the child if it still runs (SIGKILL after a SIGTERM that is not heard)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class Done(NamedTuple):
    """A finished command."""

    code: int
    lines: list[str]
    stderr: str


class TicketDesk:
    """The example folder with its own store and queue; commands run as ``python3 worker.py`` would."""

    def __init__(self, tmp_path: Path, amqp_url: str, handler: str = "handler") -> None:
        self.folder = copy_example(tmp_path / "ticket_desk")
        self.db_path = tmp_path / "nightjar.db"
        self.queue = unique_queue("nightjar-test")
        self.env = {
            **os.environ,
            "AMQP_URL": amqp_url,
            "TICKET_DESK_DB": str(self.db_path),
            "TICKET_DESK_QUEUE": self.queue,
            "TICKET_DESK_QUEUE_EXPIRES_MS": str(QUEUE_EXPIRES_MS),
            "TICKET_DESK_HANDLER": handler,
            "PYTHONUNBUFFERED": "1",
        }
        self.url = ""
        self.site: Child | None = None
        self._children: list[Child] = []

    # -- child processes ------------------------------------------------------------------------------

    def start(self, script: str, *args: str, handler: str | None = None, **env: str) -> Child:
        """Start ``python <script> args`` in the example folder."""
        child_env = {**self.env, **env, **({"TICKET_DESK_HANDLER": handler} if handler else {})}
        child = Child([sys.executable, script, *args], child_env, self.folder)
        self._children.append(child)
        return child

    def run(self, script: str, *args: str, handler: str | None = None, **env: str) -> Done:
        """Run to the end; the exit status, the stdout lines and stderr."""
        child = self.start(script, *args, handler=handler, **env)
        code = child.wait()
        return Done(code, child.lines, child.stderr())

    def worker(self, *args: str, handler: str | None = None) -> list[str]:
        """``python3 worker.py args``, which must exit 0; its stdout lines."""
        child = self.start("worker.py", *args, handler=handler)
        code = child.wait()
        assert code == 0, f"worker exited {code}: {child.lines} {child.stderr()}"
        return child.lines

    def paused_worker(self, pause: str, handler: str | None = None) -> Child:
        """``python3 worker.py --pause NAME`` once it printed ``Paused NAME.``."""
        child = self.start("worker.py", "--pause", pause, handler=handler)
        child.expect(f"Paused {pause}.")
        return child

    def desk(self, *args: str) -> Done:
        """``python3 desk.py args``."""
        return self.run("desk.py", *args)

    def start_site(self) -> str:
        """Start the Nightjar site on a free loopback port; its base URL."""
        self.site = self.start("app.py", "--port", "0")
        self.url = self.site.expect("Nightjar is open at ").rsplit(" ", 1)[1].rstrip("/")
        return self.url

    def close(self) -> None:
        """Stop every child still running."""
        for child in self._children:
            child.stop()

    # -- the site ---------------------------------------------------------------------------------------

    def get(self, path: str) -> str:
        """GET a page; its text."""
        with urllib.request.urlopen(self.url + path, timeout=STEP_TIMEOUT) as response:
            text: str = response.read().decode("utf-8")
            return text

    def fetch(self, path: str, data: bytes | None = None) -> tuple[int, str, float]:
        """GET (or POST ``data``) without raising on an error status: the status, the text and the seconds it took."""
        started = time.monotonic()
        try:
            with urllib.request.urlopen(self.url + path, data=data, timeout=STEP_TIMEOUT) as response:
                status, text = response.status, response.read().decode("utf-8")
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode("utf-8")
        return status, text, time.monotonic() - started

    def get_response(self, path: str) -> tuple[dict[str, str], str]:
        """GET a page: headers and text."""
        with urllib.request.urlopen(self.url + path, timeout=STEP_TIMEOUT) as response:
            return dict(response.headers), response.read().decode("utf-8")

    def register(self, name: str) -> tuple[str, str]:
        """Register ``name`` on The evening's form; the new id and its page, once the relay has published it."""
        data = urllib.parse.urlencode({"name": name}).encode()
        with urllib.request.urlopen(self.url + "/registrations", data=data, timeout=STEP_TIMEOUT) as response:
            page = response.read().decode("utf-8")
            registration_id = response.url.rsplit("/", 1)[1]
        eventually_sync(
            lambda: self.published(registration_id),
            f"the relay to publish {registration_id}",
            timeout=STEP_TIMEOUT,
        )
        return registration_id, page

    # -- the store and the broker -----------------------------------------------------------------------

    @contextlib.contextmanager
    def db(self) -> Iterator[sqlite3.Connection]:
        """A read connection to the store."""
        con = sqlite3.connect(self.db_path, timeout=10)
        try:
            yield con
        finally:
            con.close()

    def published(self, registration_id: str) -> bool:
        """Whether the broker confirmed the registration's outbox message."""
        with self.db() as con:
            row = con.execute("SELECT sent_at FROM outbox WHERE message_id = ?", (registration_id,)).fetchone()
        return row is not None and row[0] is not None

    def tickets(self, registration_id: str) -> list[tuple[int, str]]:
        """``(ticket_no, name)`` of each ticket of the registration, oldest first."""
        with self.db() as con:
            sql = "SELECT ticket_no, name FROM tickets WHERE registration_id = ? ORDER BY ticket_no"
            return [(int(no), str(name)) for no, name in con.execute(sql, (registration_id,))]

    def completed(self, registration_id: str) -> bool:
        """Whether the registration has a completion key."""
        with self.db() as con:
            return con.execute("SELECT 1 FROM completed WHERE id = ?", (registration_id,)).fetchone() is not None

    def all_rows(self) -> dict[str, list[tuple[object, ...]]]:
        """Every registration, ticket and completion key, for comparing before and after."""
        with self.db() as con:
            return {
                table: con.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("registrations", "tickets", "completed")
            }

    def counts(self) -> tuple[int, int] | None:
        """``(ready, unacknowledged)`` of the test's queue."""
        return queue_counts(self.queue)

    def wait_for_counts(self, ready: int, unacknowledged: int, timeout: float = 10.0) -> None:
        """Wait until the queue shows these counts (the broker settles acks and requeues asynchronously)."""
        expected = (ready, unacknowledged)
        eventually_sync(
            lambda: self.counts() == expected,
            f"{self.queue} to show (ready, unacked) {expected}",
            timeout=timeout,
        )

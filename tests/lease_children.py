"""Child processes for the lease lab tests, and the small helpers the test modules share.

Children run this file by path, from any working directory: ``spawn()`` starts
``python tests/lease_children.py MODE CONFIG_JSON`` with the repository root (``Path(__file__).parents[1]``)
on ``PYTHONPATH``, so each child imports ``asyncq.lab.lease`` by name as the grader's children do.

Modes (each takes one JSON object):

- ``claimer``: open the queue once, then per line ``NOW`` on stdin answer ``ready``, block on one byte from
  the shared release pipe, ``claim`` and print the outcome (ticket, none, or the error's class and message).
- ``fault``: run ``claim``/``finish``/``redrive`` with a hook that calls ``os._exit(FAULT_EXIT)`` at one point.
- ``hold``: ``claim`` with a hook that announces a point on stdout and blocks there until it is killed.
- ``deliver``: ``run_file`` with a scripted clock and a ``send`` that POSTs to a receiver, returns ``True``,
  or announces itself and blocks (to be killed mid-send).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
FAULT_EXIT = 17
JOB_COLUMNS = (
    "seq",
    "id",
    "qty",
    "status",
    "attempts",
    "max_attempts",
    "token",
    "available_at",
    "deadline",
    "owner",
    "lease_until",
    "reason",
)

# --- helpers for the test modules ------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment of a child: this one, with the repository root first on ``PYTHONPATH``."""
    env = dict(os.environ)
    parts = [str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def spawn(
    mode: str, config: dict[str, Any], cwd: Path, *, pass_fds: Sequence[int] = (), stdin: bool = True
) -> subprocess.Popen[bytes]:
    """Start ``python lease_children.py MODE CONFIG`` in ``cwd``; stdout is a pipe, stderr a file in ``cwd``."""
    errors = open(cwd / f"child-{mode}-{time.monotonic_ns()}.stderr", "wb")  # noqa: SIM115 (kept by the child)
    try:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), mode, json.dumps(config)],
            cwd=cwd,
            env=child_env(),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            pass_fds=tuple(pass_fds),
            bufsize=0,
        )
    finally:
        errors.close()


def stderr_of(cwd: Path) -> str:
    """Everything the children started in ``cwd`` wrote to stderr (for failure messages)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(cwd.glob("child-*.stderr")))


class Lines:
    """Reads lines from a child's stdout, failing fast with a deadline instead of blocking forever."""

    def __init__(self, proc: subprocess.Popen[bytes], cwd: Path) -> None:
        assert proc.stdout is not None
        self.proc, self.cwd, self.fd, self.buffer = proc, cwd, proc.stdout.fileno(), b""

    def read(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line from child {self.proc.pid} in {timeout}s\n{stderr_of(self.cwd)}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    code = self.proc.wait(timeout=5)
                    raise AssertionError(f"child {self.proc.pid} exited ({code})\n{stderr_of(self.cwd)}")
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def json(self, timeout: float = 10.0) -> Any:
        return json.loads(self.read(timeout))


def send_line(proc: subprocess.Popen[bytes], text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text.encode() + b"\n")
    proc.stdin.flush()


def finish_child(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """Close the child's stdin and wait for it; kill it (by its pid) if it does not end in time."""
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def dump(target: sqlite3.Connection | str | os.PathLike[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of both tables, in ``seq`` order; a path is read through a fresh plain connection
    (which also rolls back a hot journal left by a killed process)."""
    if isinstance(target, sqlite3.Connection):
        return {
            "jobs": target.execute("SELECT * FROM jobs ORDER BY seq").fetchall(),
            "redrives": target.execute("SELECT * FROM redrives ORDER BY seq").fetchall(),
        }
    con = sqlite3.connect(target, timeout=5)
    try:
        return dump(con)
    finally:
        con.close()


def row(target: sqlite3.Connection | str | os.PathLike[str], job_id: str) -> dict[str, Any] | None:
    """One job as a dict of its columns, or ``None``."""
    for values in dump(target)["jobs"]:
        if values[1] == job_id:
            return dict(zip(JOB_COLUMNS, values, strict=True))
    return None


# --- the children ---------------------------------------------------------------------------------


def _emit(value: object) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def _error(exc: BaseException) -> dict[str, str]:
    return {"error": type(exc).__name__, "message": str(exc)}


def run_claimer(config: dict[str, Any]) -> None:
    from asyncq.lab import lease

    con = lease.open_queue(config["db"])
    for line in sys.stdin:
        now = int(line)
        _emit("ready")
        if os.read(config["release_fd"], 1) != b"x":
            raise SystemExit("release pipe closed")
        try:
            ticket = lease.claim(con, config["owner"], now)
        except Exception as exc:
            _emit({**_error(exc), "in_transaction": con.in_transaction})
        else:
            _emit({"ticket": ticket, "in_transaction": con.in_transaction})
    con.close()


def run_fault(config: dict[str, Any]) -> None:
    from asyncq.lab import lease

    seen: list[str] = []

    def hook(point: str) -> None:
        seen.append(point)
        if point == config["point"]:
            os._exit(FAULT_EXIT)

    con = lease.open_queue(config["db"])
    operation: Callable[..., object] = getattr(lease, config["op"])
    result = operation(con, *config["args"], fault=hook)
    _emit({"result": result, "seen": seen})


def run_hold(config: dict[str, Any]) -> None:
    from asyncq.lab import lease

    def hook(point: str) -> None:
        if point == config["point"]:
            _emit(point)
            sys.stdin.readline()  # blocks until the parent kills this process

    con = lease.open_queue(config["db"])
    _emit({"result": lease.claim(con, config["owner"], config["now"], fault=hook)})


def _sender(config: dict[str, Any]) -> Callable[[dict[str, Any]], object]:
    def send(message: dict[str, Any]) -> object:
        if config["send"] == "true":
            _emit({"sent": message})
            return True
        if config["send"] == "block":
            _emit({"sending": message})
            sys.stdin.readline()  # blocks until the parent kills this process
            return True
        request = urllib.request.Request(
            config["url"],
            data=json.dumps(message).encode(),
            headers={"Content-Type": "application/json", "X-Deliverer-Pid": str(os.getpid())},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
        return response.status == 200 and answer.get("ok") is True

    return send


def run_deliver(config: dict[str, Any]) -> None:
    from asyncq.lab import lease

    clocks = list(config["clocks"])
    if config.get("wait_go"):
        sys.stdin.readline()
    if "release_fd" in config:
        _emit("ready")
        if os.read(config["release_fd"], 1) != b"x":
            raise SystemExit("release pipe closed")
    try:
        result = lease.run_file(config["db"], config["owner"], lambda: clocks.pop(0), _sender(config), 1.0)
    except Exception as exc:
        _emit(_error(exc))
    else:
        _emit({"result": result})


MODES = {"claimer": run_claimer, "fault": run_fault, "hold": run_hold, "deliver": run_deliver}

if __name__ == "__main__":
    MODES[sys.argv[1]](json.loads(sys.argv[2]))

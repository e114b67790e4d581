"""``asyncq work`` and ``asyncq serve-inbox`` as real processes: a burst drains a queue into a real receiver,
a Python handler runs with a progress line on a terminal, and SIGTERM stops a worker gracefully."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import cli_env, holding_write_lock, run_cli, run_json, run_on_terminal
from waiting import eventually_sync, exited

pytestmark = pytest.mark.timeout(60)

HANDLERS = """
import asyncio, pathlib
from asyncq.errors import Permanent

async def handle(body, context):
    if body.get("refuse"):
        raise Permanent("refused by the test")
    pathlib.Path("handled.txt").open("a").write(f"{context.id} {context.attempt}\\n")

async def slow(body, context):  # in flight until the test, having sent SIGTERM, releases it
    pathlib.Path("started.txt").write_text(context.id)
    while not pathlib.Path("release.txt").exists():
        await asyncio.sleep(0.01)

def not_async(body, context):
    return None
"""

TASKS_APP = """
import asyncq

app = asyncq.App()

@app.task
async def note(text: str) -> str:
    return text
"""


def jobs_on_stdin(count: int, prefix: str = "j") -> str:
    return "".join(
        json.dumps({"id": f"{prefix}-{n}", "body": {"item": "snack", "qty": 1}}) + "\n" for n in range(count)
    )


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[str]:
    """``asyncq serve-inbox`` on a sink file, with the stock effect; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncq", "serve-inbox", "--db", "sink.db", "--port", "0", "--effect", "stock"],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/events"), process.stderr
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def test_work_burst_drains_the_queue_into_a_real_inbox(tmp_path: Path, receiver: str) -> None:
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    assert run_json("enqueue", "--db", "q.db", cwd=tmp_path, stdin=jobs_on_stdin(400))["added"] == 400
    data = run_json("work", "--db", "q.db", "--url", receiver, "--burst", "--concurrency", "8", cwd=tmp_path)
    assert data["claimed"] == 400 and data["finished"] == {"done": 400}
    assert data["queues"] == ["default"] and data["stale_finishes"] == 0 and data["handler_errors"] == 0
    assert set(data) == {
        "path", "owner", "queues", "seconds", "claimed", "finished", "stale_finishes", "leases_lost",
        "handler_errors", "commits", "internal_errors", "store_busy", "cancels_requested", "cancelled",
        "retention_removed", "retention_runs", "schedule_ticks",
    }  # fmt: skip
    assert data["internal_errors"] == data["store_busy"] == 0
    status = run_json("status", "--db", "q.db", "--inbox", "sink.db", cwd=tmp_path)
    assert status["by_status"] == {"pending": 0, "leased": 0, "done": 400, "dead": 0, "waiting": 0}
    assert status["inbox"] == {"file": "sink.db", "applied": 400, "duplicates": 0, "conflicts": 0}
    text = run_cli("work", "--db", "q.db", "--url", receiver, "--burst", cwd=tmp_path)
    assert text.returncode == 0 and "claimed 0" in text.stdout


def test_work_runs_a_python_handler_with_progress_on_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    lines = jobs_on_stdin(30) + json.dumps({"id": "bad", "body": {"refuse": True}, "queue": "hq"}) + "\n"
    lines += json.dumps({"id": "good", "body": {}, "queue": "hq"}) + "\n"
    assert run_json("enqueue", "--db", "q.db", cwd=tmp_path, stdin=lines)["added"] == 32
    args = ("work", "--db", "q.db", "--handler", "handlers:handle", "--queue", "default", "--queue", "hq")
    code, out, terminal = run_on_terminal(*args, "--burst", "--json", cwd=tmp_path)
    assert code == 0, terminal
    data = json.loads(out)
    assert data["queues"] == ["default", "hq"] and data["finished"] == {"done": 31, "dead": 1}
    assert "claimed " in terminal and "running " in terminal and "jobs/s" in terminal
    assert len((tmp_path / "handled.txt").read_text().splitlines()) == 31
    dead = run_json("dead", "--db", "q.db", cwd=tmp_path)
    assert [(job["id"], job["reason"]) for job in dead["jobs"]] == [("bad", "permanent")]


def test_work_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    assert run_cli("enqueue", "--db", "q.db", "slow-1", "{}", cwd=tmp_path).returncode == 0
    worker = subprocess.Popen(
        [sys.executable, "-m", "asyncq", "work", "--db", "q.db", "--handler", "handlers:slow", "--json"],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    eventually_sync((tmp_path / "started.txt").exists, "the handler to start", timeout=20, stop=exited([worker]))
    worker.send_signal(signal.SIGTERM)
    (tmp_path / "release.txt").write_text("")  # the job ends only after the signal was sent
    out, err = worker.communicate(timeout=20)
    assert worker.returncode == 0, err
    assert json.loads(out)["finished"] == {"done": 1}  # the job in flight finished within the grace period
    assert run_json("status", "--db", "q.db", cwd=tmp_path)["by_status"]["done"] == 1


def test_work_refuses_a_handler_that_is_not_async(tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    done = run_cli("work", "--db", "q.db", "--handler", "handlers:not_async", "--burst", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        "asyncq: error: the handler handlers:not_async must be an async function taking (body, context)\n"
    )


@pytest.mark.parametrize("command", [["work", "--handler", "handlers:handle"], ["worker", "tasks_app:app"]])
def test_a_worker_started_while_another_process_holds_the_lock_waits_for_it(tmp_path: Path, command: list[str]) -> None:
    """The lock is held well past ``--timeout`` while the worker starts: it waits (each wait logged and counted,
    with backoff) instead of exiting after the timeout, and runs the job once the holder lets go."""
    (tmp_path / "handlers.py").write_text(HANDLERS)
    (tmp_path / "tasks_app.py").write_text(TASKS_APP)
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    job = {"id": "j-1", "body": {"task": "note", "args": {"text": "hi"}}}
    assert run_json("enqueue", "--db", "q.db", cwd=tmp_path, stdin=json.dumps(job) + "\n")["added"] == 1
    argv = [sys.executable, "-m", "asyncq", *command, "--db", "q.db", "--burst", "--timeout", "0.2", "--json"]
    with holding_write_lock(tmp_path / "q.db"):
        worker = subprocess.Popen(
            [*argv, "--log-level", "warning"], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert worker.stderr is not None
        waits = 0
        while waits < 4:  # 0.2 s each before its backoff: the lock outlives the timeout several times over
            line = worker.stderr.readline()
            assert line, f"the worker ended while the lock was held: rc {worker.wait()}"
            waits += "store busy" in line and "the queue is not open yet" in line
        assert worker.poll() is None
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    report = json.loads(out)
    assert report["store_busy"] >= 4 and report["finished"] == {"done": 1}
    assert run_json("show", "j-1", "--db", "q.db", cwd=tmp_path)["job"]["status"] == "done"

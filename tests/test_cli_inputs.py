"""Inputs a newcomer met at the ``asyncq`` command's edges (issues 19 and 20), each run as a real subprocess:
its exit status, its one line of output, and the queue file's bytes afterwards."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from cli_support import cli_env, fingerprint, run_cli, run_json

from asyncq.store.sqlite.migrations import SCHEMA_VERSION

pytestmark = pytest.mark.timeout(60)


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The one line a command printed (stdout on success, stderr on failure), after checking its exit status."""
    assert done.returncode == code, (done.args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    printed, silent = (done.stdout, done.stderr) if code == 0 else (done.stderr, done.stdout)
    assert silent == "", silent
    [line] = printed.splitlines()
    return line


def test_version_prints_one_line_and_exits_zero(tmp_path: Path) -> None:
    assert one_line(run_cli("--version", cwd=tmp_path), 0).startswith("asyncq ")
    assert "--version" in run_cli("--help", cwd=tmp_path).stdout


def test_init_in_a_missing_directory_says_so_in_one_line_every_time(tmp_path: Path) -> None:
    for _ in range(5):  # the aiosqlite "Event loop is closed" traceback came only sometimes
        line = one_line(run_cli("init", "--db", "missing/dir/q.db", cwd=tmp_path), 1)
        assert line == f"asyncq: error: no such directory: {tmp_path / 'missing' / 'dir'} (create it first)"
    assert sorted(tmp_path.iterdir()) == []


def test_enqueue_takes_null_as_a_body(db: Path) -> None:
    line = one_line(run_cli("enqueue", "--db", "q.db", "g1", "null", cwd=db.parent), 0)
    assert line.startswith("enqueued 1 new job(s) into q.db")
    with closing(sqlite3.connect(db)) as con:
        assert con.execute("SELECT body FROM asyncq_jobs WHERE id = 'g1'").fetchall() == [("null",)]
    assert run_json("show", "--db", "q.db", "g1", cwd=db.parent)["job"]["body"] is None


def test_enqueue_refuses_a_stdin_line_that_repeats_a_key(db: Path) -> None:
    before = fingerprint(db)
    lines = '{"id": "r-1", "body": 1}\n{"id": "r-2", "body": {"a": 1, "a": 2}}\n'
    line = one_line(run_cli("enqueue", "--db", "q.db", cwd=db.parent, stdin=lines), 1)
    assert line == "asyncq: error: stdin line 2 is not JSON: a JSON object repeats a key"
    assert fingerprint(db) == before


def test_redrive_with_a_bad_ttl_prints_nothing_but_the_refusal(db: Path) -> None:
    before = fingerprint(db)
    line = one_line(run_cli("redrive", "--db", "q.db", "x-exh-1", "--note", "n", "--ttl", "0s", cwd=db.parent), 2)
    assert line.startswith("asyncq: error: argument --ttl: '0s' is not a duration from 1ms to 365d")
    assert fingerprint(db) == before


def test_redrive_prints_the_audit_rows_the_calls_returned(db: Path) -> None:
    data = run_json("redrive", "--db", "q.db", "x-exh-1", "x-dl-1", "--note", "INC-7", cwd=db.parent)
    assert [(a["id"], a["action"], a["note"], a["reason"]) for a in data["audit"]] == [
        ("x-exh-1", "redrive", "INC-7", None),
        ("x-dl-1", "redrive", "INC-7", None),
    ]
    with closing(sqlite3.connect(db)) as con:
        written = con.execute("SELECT seq, id, token, at_ms FROM asyncq_audit WHERE note = 'INC-7' ORDER BY seq")
        assert [(a["seq"], a["id"], a["token"], a["at_ms"]) for a in data["audit"]] == written.fetchall()


@pytest.mark.parametrize("port", ["99999", "-1", "70000", "http", "1e3"])
def test_a_server_port_out_of_range_is_a_usage_error(tmp_path: Path, port: str) -> None:
    for command in ("serve-inbox", "dashboard"):
        line = one_line(run_cli(command, "--db", "x.db", "--port", port, cwd=tmp_path), 2)
        assert line.startswith(f"asyncq: error: argument --port: {port!r} is not a whole number from 0 to 65535")
    assert sorted(tmp_path.iterdir()) == []


def read_only_mount_works(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind -o ro {probe} {probe} && ! touch {probe}/x"], capture_output=True
    )
    probe.rmdir()
    return done.returncode == 0


def status_on_a_read_only_mount(directory: Path, name: str) -> subprocess.CompletedProcess[str]:
    """``asyncq status --json`` run where ``directory`` is mounted read-only (a private mount namespace, so that
    even root cannot write there)."""
    script = f'mount --bind -o ro {directory} {directory} && exec "$@"'
    command = ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "asyncq", "status", "--db", name]
    return subprocess.run(
        [*command, "--json"], cwd=directory, env=cli_env(), capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def read_only_dir(tmp_path: Path, template: Path) -> Path:
    if shutil.which("unshare") is None or not read_only_mount_works(tmp_path):
        pytest.skip("needs a private mount namespace (unshare -m) to make a directory read-only")
    directory = tmp_path / "ro"
    directory.mkdir()
    shutil.copyfile(template, directory / "q.db")
    return directory


def test_status_reads_a_delete_mode_queue_in_a_read_only_directory(read_only_dir: Path) -> None:
    with closing(sqlite3.connect(read_only_dir / "q.db", isolation_level=None)) as con:
        assert con.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    before = fingerprint(read_only_dir / "q.db")
    done = status_on_a_read_only_mount(read_only_dir, "q.db")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert '"pending": 3' in done.stdout
    assert fingerprint(read_only_dir / "q.db") == before
    assert sorted(p.name for p in read_only_dir.iterdir()) == ["q.db"]


def test_status_reads_a_closed_wal_queue_in_a_read_only_directory(read_only_dir: Path) -> None:
    assert sorted(p.name for p in read_only_dir.iterdir()) == ["q.db"]  # checkpointed, no side files
    before = fingerprint(read_only_dir / "q.db")
    done = status_on_a_read_only_mount(read_only_dir, "q.db")
    assert fingerprint(read_only_dir / "q.db") == before
    assert done.returncode == 0, done.stderr
    assert '"pending": 3' in done.stdout


def test_a_write_command_leaves_the_queue_checkpointed(db: Path) -> None:
    assert one_line(run_cli("enqueue", "--db", "q.db", "c-1", "1", cwd=db.parent), 0).startswith("enqueued 1")
    assert sorted(p.name for p in db.parent.iterdir()) == ["q.db"]


def test_a_newer_schema_is_refused_by_reads_and_writes_unchanged(db: Path) -> None:
    with closing(sqlite3.connect(db)) as con:
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = fingerprint(db)
    for args in (["status"], ["enqueue", "n-1", "1"], ["init"], ["cancel", "p-1", "--note", "n"]):
        line = one_line(run_cli(*args, "--db", "q.db", cwd=db.parent), 1)
        assert line.startswith(f"asyncq: error: q.db has schema version {SCHEMA_VERSION + 1}, newer than"), line
    assert fingerprint(db) == before


OPEN_IN_A_MISSING_DIRECTORY = """
import asyncio, sys
from asyncq.queue import Queue
try:
    asyncio.run(Queue.open(sys.argv[1]))
except Exception as error:
    print(type(error).__name__)
"""


def test_opening_a_queue_in_a_missing_directory_fails_with_one_error_and_no_thread_traceback(tmp_path: Path) -> None:
    """The library-level cause of ``init``'s stray traceback (the command now checks the directory first)."""
    done = subprocess.run(
        [sys.executable, "-c", OPEN_IN_A_MISSING_DIRECTORY, str(tmp_path / "missing" / "q.db")],
        env=cli_env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.stdout == "StoreError\n"  # "its directory … does not exist", before SQLite tries
    assert "Event loop is closed" not in done.stderr and done.stderr == "", done.stderr

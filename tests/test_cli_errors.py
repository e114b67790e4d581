"""Every way the ``asyncq`` command can be pointed wrong gives one clear line, a meaningful exit status, no
traceback, and leaves the file byte for byte as it was (a missing file is never created)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import fingerprint, holding_write_lock, run_cli, run_many

from asyncq.store.sqlite.admin import filesystem_type

pytestmark = pytest.mark.timeout(60)

# Every command that needs an existing queue file, as run on "q.db" (the error comes before any work).
ON_A_QUEUE = [
    ["status"],
    ["jobs"],
    ["show", "p-1"],
    ["dead"],
    ["redrive", "--reason", "permanent", "--note", "n"],
    ["redrive", "x-exh-1", "--note", "n"],
    ["prune", "--older-than", "1d"],
    ["prune", "--older-than", "1s", "--apply"],
    ["enqueue", "e-1", "{}"],
    ["cancel", "p-1", "--note", "n"],
    ["backup", "copy.db"],
    ["work", "--handler", "nowhere:handle", "--burst"],
]
WRITERS = [
    ["init"],
    ["enqueue", "e-1", "{}"],
    ["cancel", "p-1", "--note", "n"],
    ["redrive", "x-exh-1", "--note", "n"],
    ["redrive", "--reason", "permanent", "--note", "n", "--apply"],
    ["prune", "--older-than", "1s", "--apply"],
]


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    """Exit status ``code``, nothing on stdout, one line ``asyncq: error: …`` holding ``message`` on stderr."""
    assert done.returncode == code, (done.args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.startswith("asyncq: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr, (done.args, done.stderr)


def test_a_missing_file_is_reported_and_never_created(tmp_path: Path) -> None:
    results = run_many([[*args, "--db", "q.db"] for args in ON_A_QUEUE], cwd=tmp_path)
    for done in results:
        assert_one_line_error(done, 1, "asyncq: error: no such queue file: q.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_sqlite_file_without_a_queue_is_not_a_queue(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE orders (id TEXT)")
    con.close()  # checkpointed: only the main file is left
    before = fingerprint(tmp_path / "q.db")
    for done in run_many([[*args, "--db", "q.db"] for args in ON_A_QUEUE], cwd=tmp_path):
        assert_one_line_error(done, 1, "asyncq: error: q.db is not an asyncq queue (it has no ")
    assert fingerprint(tmp_path / "q.db") == before
    assert not (tmp_path / "copy.db").exists()


def test_a_file_that_is_not_sqlite_is_refused_unchanged(tmp_path: Path) -> None:
    (tmp_path / "q.db").write_text("these are my notes, not a database\n" * 200)
    before = fingerprint(tmp_path / "q.db")
    commands = [[*args, "--db", "q.db"] for args in [*ON_A_QUEUE, ["init"]]]
    for done in run_many(commands, cwd=tmp_path):
        assert_one_line_error(done, 1, "q.db is not a SQLite database (file is not a database)")
    assert fingerprint(tmp_path / "q.db") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.db"]


@pytest.fixture
def locked(tmp_path: Path, template: Path) -> Iterator[Path]:
    """A queue file whose write lock another process holds (BEGIN IMMEDIATE) for the test's duration."""
    db = tmp_path / "q.db"
    shutil.copyfile(template, db)
    with holding_write_lock(db):
        yield db


def test_a_write_command_facing_a_held_lock_fails_after_its_timeout(locked: Path) -> None:
    # The fingerprint is taken outside the holder's lifetime: reading the file in a process that holds a SQLite
    # lock on it would drop that lock (POSIX locks belong to the process), so compare against the template.
    template_print = fingerprint(locked)
    commands = [[*args, "--db", "q.db", "--timeout", "0.2"] for args in WRITERS]
    for done in run_many(commands, cwd=locked.parent):
        assert_one_line_error(done, 1, "database is locked: another process held the write lock for more than 0.2 s")
    reads = run_many(
        [["status", "--db", "q.db", "--timeout", "0.2"], ["jobs", "--db", "q.db", "--timeout", "0.2"]],
        cwd=locked.parent,
    )
    assert [done.returncode for done in reads] == [0, 0]  # WAL: readers never wait for the writer
    assert template_print == fingerprint(locked)


def test_a_backup_facing_a_held_lock_is_not_kept_waiting(locked: Path) -> None:
    done = run_cli("backup", "b.db", "--db", "q.db", "--timeout", "0.2", cwd=locked.parent)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cancel", "p-1", "--note", "two\nlines"], "argument --note: note must be 1-500 printable characters"),
        (["prune", "--older-than", "7 days"], "argument --older-than: '7 days' is not a duration"),
        (["enqueue", "bad id", "{}"], "argument ID: 'bad id' is not"),
        (["enqueue", "e-1", "{not json"], "argument BODY: not JSON"),
        (["enqueue", "e-1", '{"a": 1, "a": 2}'], "argument BODY: not JSON: a JSON object repeats a key"),
        (["enqueue", "e-1", "NaN"], "argument BODY: not JSON: JSON constant NaN is not allowed"),
        (["enqueue", "e-1", "[Infinity]"], "argument BODY: not JSON: JSON constant Infinity is not allowed"),
        (["enqueue", "e-1", "1", "--max-attempts", "5000"], "argument --max-attempts: '5000' is not a whole number"),
        (["enqueue", "e-1", "1", "--max-attempts", "²"], "argument --max-attempts: '²' is not a whole number"),
        (["enqueue", "e-1", "1", "--ttl", "0s"], "argument --ttl: '0s' is not a duration from 1ms to 365d"),
        (["enqueue", "e-1", "1", "--ttl", "366d"], "argument --ttl: '366d' is not a duration from 1ms to 365d"),
        (["enqueue", "e-1", "1", "--delay", "2d"], "--delay must not be longer than --ttl"),
        (["enqueue", "e-1", '"' + "x" * 70_000 + '"'], "BODY: body is larger than 65536 bytes as JSON"),
        (["redrive", "x-exh-1", "--note", "n", "--ttl", "0s"], "argument --ttl: '0s' is not a duration"),
        (["redrive", "x-exh-1", "--note", "n", "--apply"], "--queue, --limit and --apply go with --reason"),
        (["jobs", "--after", "99999999999999999999"], "argument --after: '99999999999999999999' is not a whole"),
        (["dead", "--after", "99999999999999999999"], "argument --after: '99999999999999999999' is not a whole"),
        (["jobs", "--after", "-1"], "argument --after: '-1' is not a whole number from 0 to"),
        (["jobs", "--limit", "1001"], "argument --limit: '1001' is not a whole number from 1 to 1000"),
        (["work", "--handler", "m:f", "--concurrency", "1001"], "argument --concurrency: '1001' is not a whole"),
        (["work", "--handler", "m:f", "--lease", "2d"], "argument --lease: '2d' is not a duration from 4ms to 1d"),
        (["status", "--timeout", "nan"], "argument --timeout: 'nan' is not a number of seconds from 0 to 86400"),
        (["enqueue", "e-1"], "give the job's BODY (JSON) after its ID"),
        (["jobs", "--status", "lost"], "argument --status: invalid choice: 'lost'"),
        (["jobs", "--limit", "0"], "argument --limit: '0' is not a whole number"),
        (["redrive", "--note", "n"], "name the dead jobs to redrive, or give --reason (not both)"),
        (["redrive", "x-exh-1", "--reason", "exhausted", "--note", "n"], "or give --reason (not both)"),
        (["redrive", "x-exh-1"], "the following arguments are required: --note"),
        (["prune", "--older-than", "1d", "--vacuum"], "--vacuum goes with --apply"),
        (["work", "--burst"], "one of the arguments --url --handler is required"),
        (["work", "--url", "http://example.com/events"], "url host 'example.com' is not in the allowed hosts"),
        (["work", "--handler", "no-colon"], "--handler must be module:function"),
        (["status", "--timeout", "soon"], "argument --timeout: 'soon' is not a number of seconds"),
        (["show"], "the following arguments are required: ID"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments_are_usage_errors_that_touch_nothing(
    tmp_path: Path, template: Path, args: list[str], message: str
) -> None:
    shutil.copyfile(template, tmp_path / "q.db")
    before = fingerprint(tmp_path / "q.db")
    done = run_cli(*args, "--db", "q.db", cwd=tmp_path)
    assert_one_line_error(done, 2, message)
    assert fingerprint(tmp_path / "q.db") == before


def test_a_missing_db_option_is_a_usage_error(tmp_path: Path) -> None:
    done = run_cli("status", cwd=tmp_path)
    assert_one_line_error(done, 2, "the following arguments are required: --db")


def test_state_errors_leave_the_file_as_it_was(tmp_path: Path, template: Path) -> None:
    db = tmp_path / "q.db"
    shutil.copyfile(template, db)
    before = fingerprint(db)
    expected = {
        ("cancel", "nope"): "asyncq: error: job 'nope' is missing\n",
        ("redrive", "p-1"): "asyncq: error: job 'p-1' is pending, not dead: nothing redriven\n",
        ("redrive", "x-exh-1", "p-2"): "asyncq: error: job 'p-2' is pending, not dead: nothing redriven\n",
    }
    commands = [[*key, "--note", "n", "--db", "q.db"] for key in expected]
    for done, message in zip(run_many(commands, cwd=tmp_path), expected.values(), strict=True):
        assert_one_line_error(done, 1, "")
        assert done.stderr == message
    late = run_cli("cancel", "x-perm-1", "--note", "n", "--db", "q.db", cwd=tmp_path)  # an outcome, not an error
    assert (late.returncode, late.stderr) == (1, "")
    assert late.stdout.startswith("too_late: x-perm-1 is dead")
    assert fingerprint(db) == before


def test_the_file_system_of_a_path_is_read_from_the_mount_table() -> None:
    mounts = (
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /srv/shared nfs4 rw 0 0\n"
        "//nas/q /mnt/my\\040share cifs rw 0 0\n"
        "tmpfs /srv/shared/tmp tmpfs rw 0 0\n"
    )
    assert filesystem_type("/srv/shared/q.db", mounts) == "nfs4"
    assert filesystem_type("/srv/shared/tmp/q.db", mounts) == "tmpfs"
    assert filesystem_type("/mnt/my share/q.db", mounts) == "cifs"
    assert filesystem_type("/srv/sharedness/q.db", mounts) == "ext4"
    assert filesystem_type("/home/q.db", "") == ""

"""The ``asyncq`` command as a real subprocess on real queue files: help, init, enqueue and the reads.

Errors are in ``test_cli_errors.py``, the operator's changes in ``test_cli_operator.py``, the worker in
``test_cli_work.py``.
"""

from __future__ import annotations

import ast
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from cli_support import (
    EXPECTED_DEAD,
    EXPECTED_STATUS,
    fingerprint,
    run_cli,
    run_json,
    run_many,
    run_on_terminal,
)

from asyncq.store.sqlite.connection import open_file, write_transaction
from asyncq.store.sqlite.inbox import INBOX_TABLES, record_event
from asyncq.store.sqlite.migrations import SCHEMA_VERSION as SCHEMA
from asyncq.store.sqlite.schema import PRODUCT_TABLES

pytestmark = pytest.mark.timeout(60)

COMMANDS = ["init", "enqueue", "status", "jobs", "show", "dead", "redrive", "cancel", "prune", "backup", "work"]


def rows(path: Path, statement: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as con:
        return con.execute(statement).fetchall()


def test_every_subcommand_has_help(tmp_path: Path) -> None:
    results = run_many([["--help"], [], *([name, "--help"] for name in [*COMMANDS, "serve-inbox"])], cwd=tmp_path)
    top, bare, *subcommands = results
    assert top.returncode == 0 and all(name in top.stdout for name in [*COMMANDS, "serve-inbox"])
    assert bare.returncode == 2 and bare.stderr == "asyncq: error: give a command (see `asyncq --help`)\n"
    for name, done in zip([*COMMANDS, "serve-inbox"], subcommands, strict=True):
        assert done.returncode == 0, done.stderr
        assert f"usage: asyncq {name}" in done.stdout
    assert "--json" in subcommands[COMMANDS.index("status")].stdout
    assert "--apply" in subcommands[COMMANDS.index("redrive")].stdout


def test_init_creates_an_incremental_queue_file_and_is_idempotent(tmp_path: Path) -> None:
    done = run_cli("init", "--db", "new.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"created queue new.db: schema version {SCHEMA}, journal wal, auto_vacuum incremental"
    )
    before = fingerprint(tmp_path / "new.db")
    again = run_json("init", "--db", "new.db", cwd=tmp_path)
    assert again == {
        "path": "new.db",
        "action": "checked",
        "created": False,
        "previous_schema_version": SCHEMA,
        "schema_version": SCHEMA,
        "journal_mode": "wal",
        "auto_vacuum": "incremental",
    }
    text = run_cli("init", "--db", "new.db", cwd=tmp_path).stdout
    assert text.startswith("checked queue new.db (already current: nothing changed)")
    assert fingerprint(tmp_path / "new.db") == before
    assert rows(tmp_path / "new.db", "SELECT count(*) FROM asyncq_jobs") == [(0,)]


def test_init_adds_the_tables_to_an_application_database(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "app.db") as con:
        con.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, qty INTEGER)")
        con.execute("INSERT INTO orders VALUES ('order-1', 7)")
    con.close()
    found = run_json("init", "--db", "app.db", "--durability", "full-delete", cwd=tmp_path)
    assert (found["action"], found["created"], found["previous_schema_version"]) == ("added", False, None)
    assert found["journal_mode"] == "delete" and found["auto_vacuum"] == "none"
    assert rows(tmp_path / "app.db", "SELECT * FROM orders") == [("order-1", 7)]
    assert rows(tmp_path / "app.db", "SELECT count(*) FROM asyncq_jobs") == [(0,)]
    assert run_json("init", "--db", "app.db", cwd=tmp_path)["action"] == "checked"


def test_init_on_an_app_file_says_it_added_the_queue_tables(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "app.db")) as con:
        con.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
    done = run_cli("init", "--db", "app.db", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    [line] = done.stdout.splitlines()
    assert line.startswith("added the queue tables to app.db (its other tables are as they were): schema version")
    assert rows(tmp_path / "app.db", "SELECT name FROM sqlite_master WHERE name = 'orders'") == [("orders",)]


def test_init_migrates_an_older_queue_and_says_from_which_version(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "old.db")) as con:
        con.executescript(";".join([*PRODUCT_TABLES, "PRAGMA user_version = 1"]))
    data = run_json("init", "--db", "old.db", cwd=tmp_path)
    assert (data["action"], data["previous_schema_version"], data["schema_version"]) == ("migrated", 1, SCHEMA)
    assert rows(tmp_path / "old.db", "PRAGMA user_version") == [(SCHEMA,)]


def test_enqueue_one_job_from_the_arguments(db: Path) -> None:
    cwd = db.parent
    done = run_cli("enqueue", "--db", "q.db", "new-1", '{"b": 1, "a": [1, 2]}', "--queue", "mail", cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("enqueued 1 new job(s) into q.db")
    again = run_json("enqueue", "--db", "q.db", "new-1", '{"a": [1, 2], "b": 1}', "--queue", "mail", cwd=cwd)
    assert again == {"path": "q.db", "added": 0, "unchanged": 1, "total": 1, "held_by": {}}
    assert rows(db, "SELECT queue, body, status FROM asyncq_jobs WHERE id = 'new-1'") == [
        ("mail", '{"a":[1,2],"b":1}', "pending")
    ]
    before = fingerprint(db)
    conflict = run_cli("enqueue", "--db", "q.db", "new-1", '{"a": 2}', "--queue", "mail", cwd=cwd)
    assert conflict.returncode == 1
    assert conflict.stderr == "asyncq: error: job 'new-1' already exists with a different payload\n"
    assert fingerprint(db) == before


def test_enqueue_many_from_json_lines_in_batches(db: Path) -> None:
    lines = "".join(json.dumps({"id": f"b-{n}", "body": {"n": n}}) + "\n" for n in range(1201))
    lines += '\n{"id": "b-x", "body": null, "queue": "mail", "max_attempts": 5, "delay_ms": 60000}\n'
    done = run_json("enqueue", "--db", "q.db", cwd=db.parent, stdin=lines)  # no terminal: no progress bar
    assert done == {"path": "q.db", "added": 1202, "unchanged": 0, "total": 1202, "held_by": {}}
    assert rows(db, "SELECT count(*) FROM asyncq_jobs WHERE id LIKE 'b-%'") == [(1202,)]
    assert rows(db, "SELECT queue, max_attempts, available_at - 60000 > 0 FROM asyncq_jobs WHERE id = 'b-x'") == [
        ("mail", 5, 1)
    ]
    assert run_json("enqueue", "--db", "q.db", cwd=db.parent, stdin=lines)["unchanged"] == 1202


def test_enqueue_checks_every_line_before_writing_any(db: Path) -> None:
    before = fingerprint(db)
    bad_json = '{"id": "c-1", "body": 1}\n{"id": "c-2", "body": 2}\n{"id": "c-3", body}\n'
    bad_field = '{"id": "c-1", "body": 1}\n{"id": "c-2", "body": 2, "max_attempts": 0}\n'
    unknown = '{"id": "c-1", "body": 1, "unique": true}\n'
    bad_priority = '{"id": "c-1", "body": 1, "priority": 9}\n{"id": "c-2", "body": 2, "priority": true}\n'
    for text, message in [
        (bad_json, "stdin line 3 is not JSON"),
        (bad_field, "stdin line 2: max_attempts must be between 1 and 1000"),
        (bad_priority, "stdin line 2: priority must be an int from -100 to 100, not bool"),
        (unknown, "stdin line 1 must be an object with id and body, and only"),
    ]:
        done = run_cli("enqueue", "--db", "q.db", cwd=db.parent, stdin=text)
        assert done.returncode == 1 and done.stderr.startswith(f"asyncq: error: {message}"), done.stderr
        assert done.stdout == "" and fingerprint(db) == before


def test_enqueue_shows_a_progress_bar_on_a_terminal(db: Path) -> None:
    lines = "".join(json.dumps({"id": f"t-{n}", "body": n}) + "\n" for n in range(600))
    code, out, terminal = run_on_terminal("enqueue", "--db", "q.db", "--json", cwd=db.parent, stdin=lines)
    assert code == 0 and json.loads(out)["added"] == 600
    assert "500/600 jobs" in terminal and "600/600 jobs" in terminal


def test_status_counts_reasons_attempts_and_leases(db: Path) -> None:
    before = fingerprint(db)
    data = run_json("status", "--db", "q.db", cwd=db.parent)
    assert set(data) == {
        "path", "now_ms", "total", "by_status", "dead_by_reason", "oldest_pending_age_ms", "attempts", "leases",
        "expired_leases", "inbox", "queues", "retention", "limits",
    }  # fmt: skip
    assert data["queues"] == [] and data["retention"] == [] and data["limits"] == []  # none paused, ruled or limited
    assert data["by_status"] == EXPECTED_STATUS | {"waiting": 0} and data["total"] == 16
    assert data["dead_by_reason"] == EXPECTED_DEAD
    assert data["attempts"] == [{"attempts": 0, "jobs": 3}, {"attempts": 1, "jobs": 1}]
    [lease] = data["leases"]
    assert lease["owner"] == "worker-a" and lease["held"] == 1 and lease["first_expiry_ms"] > data["now_ms"]
    assert data["expired_leases"] == 0 and data["inbox"] is None
    assert 55_000 < data["oldest_pending_age_ms"] < 600_000
    text = run_cli("status", "--db", "q.db", cwd=db.parent).stdout
    assert "pending     3" in text and "total      16" in text and "worker-a" in text and "m" in text.split("(in ")[1]
    assert "dead by reason: cancelled 2, deadline 2, exhausted 1, permanent 3" in text
    assert fingerprint(db) == before


def test_status_adds_an_inbox_totals(db: Path) -> None:
    sink = open_file(db.parent / "sink.db", INBOX_TABLES, journal_mode="WAL")
    with write_transaction(sink):
        for event_id, body in [("e-1", "1"), ("e-2", "2"), ("e-1", "1"), ("e-2", "3")]:
            record_event(sink, event_id, body, json.loads(body), 1, None)
    sink.close()
    data = run_json("status", "--db", "q.db", "--inbox", "sink.db", cwd=db.parent)
    assert data["inbox"] == {"file": "sink.db", "applied": 2, "duplicates": 1, "conflicts": 1}
    assert (
        "inbox sink.db: applied 2, duplicates 1, conflicts 1"
        in run_cli("status", "--db", "q.db", "--inbox", "sink.db", cwd=db.parent).stdout
    )
    wrong = run_cli("status", "--db", "q.db", "--inbox", "q.db", cwd=db.parent)
    assert (
        wrong.returncode == 1
        and wrong.stderr == "asyncq: error: q.db is not an asyncq inbox (it has no asyncq_inbox table)\n"
    )


def test_jobs_filters_and_pages(db: Path) -> None:
    def ids(*args: str) -> list[str]:
        return [job["id"] for job in run_json("jobs", "--db", "q.db", *args, cwd=db.parent)["jobs"]]

    assert ids("--status", "dead", "--reason", "permanent") == ["old-perm", "x-perm-1", "x-perm-2"]
    assert ids("--queue", "mail") == ["m-1"]
    assert ids("--newest", "--limit", "2") == ["m-1", "p-2"]
    page = run_json("jobs", "--db", "q.db", "--limit", "5", cwd=db.parent)
    assert (page["count"], page["limit"], page["more"]) == (5, 5, True)
    assert "body" not in page["jobs"][0] and page["jobs"][0]["redrives"] == 0
    assert set(page["jobs"][0]) == {
        "seq", "id", "queue", "status", "attempts", "max_attempts", "token", "available_at", "deadline", "owner",
        "lease_until", "reason", "redrives", "priority", "cancel_requested_at", "unique_key", "task", "group", "waits",
        "limit_key",
    }  # fmt: skip
    rest = run_json("jobs", "--db", "q.db", "--after", str(page["jobs"][-1]["seq"]), "--body", cwd=db.parent)
    assert rest["count"] == 11 and rest["more"] is False and rest["jobs"][-1]["body"] == {"to": "someone"}
    text = run_cli("jobs", "--db", "q.db", "--status", "leased", cwd=db.parent).stdout
    assert text.splitlines()[0].split() == [
        "seq", "id", "queue", "prio", "status", "reason", "attempts", "redrives", "available", "deadline", "owner",
    ]  # fmt: skip
    assert "l-1" in text and "worker-a" in text and text.endswith("1 job(s)\n")


def test_jobs_body_prints_each_body_in_text(db: Path) -> None:
    text = run_cli("jobs", "--db", "q.db", "--queue", "mail", "--body", cwd=db.parent).stdout
    header, row, count = text.splitlines()
    assert header.split()[-1] == "body" and row.endswith('{"to":"someone"}') and count == "1 job(s)"
    assert "body" not in run_cli("jobs", "--db", "q.db", "--queue", "mail", cwd=db.parent).stdout


def test_show_gives_the_row_and_its_audit_history(db: Path) -> None:
    data = run_json("show", "--db", "q.db", "old-cancel", cwd=db.parent)
    job = data["job"]
    assert (job["status"], job["reason"], job["body"], job["redrives"]) == (
        "dead",
        "cancelled",
        {"job": "old-cancel"},
        0,
    )
    assert job["errors"] == []
    [entry] = data["history"]
    assert (entry["action"], entry["note"], entry["reason"], entry["token"]) == ("cancel", "old-note", "cancelled", 0)
    assert set(entry) == {"seq", "id", "action", "token", "at_ms", "note", "reason", "op_seq"}
    text = run_cli("show", "--db", "q.db", "p-1", cwd=db.parent).stdout
    assert "status        pending" in text and '"n": [' in text and "no redrive or cancel" in text
    assert "no errors recorded" in text
    missing = run_cli("show", "--db", "q.db", "nope", cwd=db.parent)
    assert missing.returncode == 1 and missing.stderr == "asyncq: error: no job 'nope' in q.db\n"


def test_dead_lists_dead_jobs_with_their_reasons(db: Path) -> None:
    data = run_json("dead", "--db", "q.db", cwd=db.parent)
    assert data["by_reason"] == EXPECTED_DEAD and data["count"] == 8 and data["more"] is False
    assert {job["status"] for job in data["jobs"]} == {"dead"}
    assert {job["last_error"] for job in data["jobs"]} == {None}  # no store records errors yet
    deadline = run_json("dead", "--db", "q.db", "--reason", "deadline", cwd=db.parent)
    assert [job["id"] for job in deadline["jobs"]] == ["old-dl", "x-dl-1"]
    text = run_cli("dead", "--db", "q.db", "--reason", "exhausted", cwd=db.parent).stdout
    assert text.startswith("dead jobs by reason: cancelled 2, deadline 2, exhausted 1, permanent 3")
    assert "x-exh-1" in text and "1/1" in text and text.splitlines()[2].split()[-2:] == ["last", "error"]


@pytest.mark.parametrize("folder", ["cli", "web"])
def test_the_command_and_the_web_talk_to_the_facade_only(folder: str) -> None:
    """No module of ``asyncq/cli`` or ``asyncq/web`` imports a driver, ``sqlite3`` or ``aiosqlite``."""
    forbidden = ("sqlite3", "aiosqlite", "asyncq.store")
    for path in sorted((Path(__file__).resolve().parents[1] / "asyncq" / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            assert not [n for n in names if n == "sqlite3" or n.startswith(forbidden)], (path.name, names)

"""The operator's changes through the ``asyncq`` command, as real subprocesses: redrive (preview, then
exactly what was previewed), cancel, prune with its vacuum, and the online backup while a writer runs."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from cli_support import DAY_MS, EXPECTED_STATUS, Clock, cli_env, fingerprint, run_cli, run_json

from asyncq.core.clock import wall_clock_ms
from asyncq.queue import Queue

pytestmark = pytest.mark.timeout(60)


def rows(path: Path, statement: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path)
    try:
        return con.execute(statement).fetchall()
    finally:
        con.close()


def test_redrive_preview_writes_nothing_and_apply_writes_exactly_the_previewed_rows(db: Path) -> None:
    before = fingerprint(db)
    preview = run_json("redrive", "--db", "q.db", "--reason", "permanent", "--note", "fixed-upstream", cwd=db.parent)
    assert fingerprint(db) == before
    assert preview["applied"] is False and preview["audit"] == [] and preview["skipped"] == []
    assert [(j["id"], j["token"], j["reason"]) for j in preview["jobs"]] == [
        ("old-perm", 1, "permanent"),
        ("x-perm-1", 1, "permanent"),
        ("x-perm-2", 1, "permanent"),
    ]
    text = run_cli("redrive", "--db", "q.db", "--reason", "permanent", "--note", "fixed-upstream", cwd=db.parent)
    assert text.stdout.startswith("would redrive 3 job(s) (nothing written; add --apply)")
    assert fingerprint(db) == before
    audit_before = rows(db, "SELECT count(*) FROM asyncq_audit")
    applied = run_json(
        "redrive", "--db", "q.db", "--reason", "permanent", "--note", "fixed-upstream", "--apply", cwd=db.parent
    )
    assert applied["applied"] is True and applied["jobs"] == preview["jobs"]
    previewed = [(j["id"], j["token"], preview["note"]) for j in preview["jobs"]]
    assert [(a["id"], a["token"], a["note"]) for a in applied["audit"]] == previewed
    written = rows(db, "SELECT id, token, note FROM asyncq_audit WHERE action = 'redrive' ORDER BY seq")
    assert written == previewed and rows(db, "SELECT count(*) FROM asyncq_audit")[0][0] == audit_before[0][0] + 3
    assert rows(db, "SELECT DISTINCT status FROM asyncq_jobs WHERE id IN ('old-perm', 'x-perm-1', 'x-perm-2')") == [
        ("pending",)
    ]
    again = run_json("redrive", "--db", "q.db", "--reason", "permanent", "--note", "again", "--apply", cwd=db.parent)
    assert again["count"] == 0 and again["audit"] == []


def test_redrive_with_a_limit_takes_the_oldest(db: Path) -> None:
    args = ("redrive", "--db", "q.db", "--reason", "permanent", "--note", "n", "--limit", "2", "--apply")
    assert [a["id"] for a in run_json(*args, cwd=db.parent)["audit"]] == ["old-perm", "x-perm-1"]


def test_redrive_named_jobs_at_once_with_their_history(db: Path) -> None:
    done = run_cli("redrive", "--db", "q.db", "x-exh-1", "x-dl-1", "--note", "INC-42", "--ttl", "2h", cwd=db.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("redrove 2 job(s); audit rows written:")
    shown = run_json("show", "--db", "q.db", "x-dl-1", cwd=db.parent)
    job = shown["job"]
    assert (job["status"], job["attempts"], job["redrives"]) == ("pending", 0, 1)
    assert 7_100_000 < job["deadline"] - shown["now_ms"] <= 7_200_000
    assert [(h["action"], h["note"]) for h in shown["history"]] == [("redrive", "INC-42")]


def test_cancel_parks_a_pending_job_with_an_audit_row(db: Path) -> None:
    data = run_json("cancel", "--db", "q.db", "p-1", "--note", "customer-left", cwd=db.parent)
    assert (data["id"], data["state"], data["status"]) == ("p-1", "cancelled", "dead")
    audit = data["audit"]
    assert (audit["id"], audit["action"], audit["note"], audit["token"]) == ("p-1", "cancel", "customer-left", 0)
    assert rows(db, "SELECT status, reason FROM asyncq_jobs WHERE id = 'p-1'") == [("dead", "cancelled")]
    text = run_cli("cancel", "--db", "q.db", "p-2", "--note", "dup", cwd=db.parent).stdout
    assert text.startswith("cancelled: p-2 is dead (now dead, reason cancelled); audit row")
    again = run_cli("cancel", "--db", "q.db", "p-2", "--note", "dup", cwd=db.parent).stdout
    assert again.startswith("too_late: p-2 is dead (it had ended already: nothing changed)")


def test_pause_and_resume_are_stored_audited_and_shown_by_status(db: Path) -> None:
    data = run_json("pause", "--db", "q.db", "mail", "--note", "provider outage", "--by", "ana", cwd=db.parent)
    assert (data["queue"], data["audit"]["action"], data["audit"]["actor"]) == ("mail", "pause", "ana")
    assert rows(db, "SELECT queue, paused_by, note FROM asyncq_queues") == [("mail", "ana", "provider outage")]
    text = run_cli("status", "--db", "q.db", cwd=db.parent).stdout
    assert "paused queues (no worker claims from them):" in text and "provider outage" in text and "ana" in text
    again = run_cli("pause", "--db", "q.db", "mail", "--note", "twice", cwd=db.parent)
    assert (
        again.returncode == 1
        and again.stderr == "asyncq: error: queue 'mail' is already paused (by ana: provider outage)\n"
    )
    usage = run_cli("pause", "--db", "q.db", "mail", cwd=db.parent)
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and "--note" in usage.stderr
    bad = run_cli("resume", "--db", "q.db", "mail", "--note", "line\nbreak", cwd=db.parent)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    text = run_cli("resume", "--db", "q.db", "mail", "--note", "provider back", cwd=db.parent).stdout
    assert text.startswith("resumed queue mail (by ") and "provider back" in text
    moves = rows(db, "SELECT queue, action, note FROM asyncq_queue_audit ORDER BY seq")
    assert moves == [("mail", "pause", "provider outage"), ("mail", "resume", "provider back")]
    assert "paused queues: none" in run_cli("status", "--db", "q.db", cwd=db.parent).stdout


def test_max_wait_is_set_and_cleared_audited_and_priorities_take_a_sign(db: Path) -> None:
    data = run_json("max-wait", "--db", "q.db", "mail", "10m", "--note", "bound the digest", cwd=db.parent)
    assert (data["audit"]["action"], data["audit"]["max_wait_ms"]) == ("max_wait", 600_000)
    assert "max_wait: mail 10m00s" in run_cli("status", "--db", "q.db", cwd=db.parent).stdout
    run_json("max-wait", "--db", "q.db", "mail", "none", cwd=db.parent)
    assert rows(db, "SELECT max_wait_ms FROM asyncq_queues WHERE queue = 'mail'") == [(None,)]
    refused = run_cli("max-wait", "--db", "q.db", "mail", "0s", cwd=db.parent)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    added = run_json("enqueue", "--db", "q.db", "low-1", "{}", "--priority", "-100", cwd=db.parent)
    assert added["added"] == 1 and rows(db, "SELECT priority FROM asyncq_jobs WHERE id = 'low-1'") == [(-100,)]
    for bad in ("101", "+5", "1.5", "-"):
        done = run_cli("enqueue", "--db", "q.db", "low-2", "{}", "--priority", bad, cwd=db.parent)
        assert done.returncode == 2 and "--priority" in done.stderr and done.stderr.count("\n") == 1


def test_prune_previews_then_deletes_old_finished_jobs_and_keeps_their_audit(db: Path) -> None:
    before = fingerprint(db)
    preview = run_json("prune", "--db", "q.db", "--older-than", "7d", cwd=db.parent)
    assert fingerprint(db) == before
    assert preview["applied"] is False and preview["deleted"] is None and preview["count"] == 6
    assert preview["by_status"] == {"done": 3, "dead": 3}
    assert preview["ids"] == ["old-done-1", "old-done-2", "old-done-3", "old-perm", "old-cancel", "old-dl"]
    assert preview["older_than_ms"] == 7 * DAY_MS and preview["cutoff_ms"] == preview["now_ms"] - 7 * DAY_MS
    only_done = run_json(
        "prune", "--db", "q.db", "--older-than", "7d", "--status", "done", "--limit", "1", cwd=db.parent
    )
    assert only_done["count"] == 3 and only_done["ids"] == ["old-done-1"]
    applied = run_json("prune", "--db", "q.db", "--older-than", "7d", "--apply", cwd=db.parent)
    assert applied["deleted"] == 6 and applied["vacuum"] == "incremental"  # Queue.open made the file so
    assert rows(db, "SELECT count(*) FROM asyncq_jobs") == [(10,)]
    assert rows(db, "SELECT id, action FROM asyncq_audit WHERE id = 'old-cancel'") == [("old-cancel", "cancel")]
    assert rows(db, "SELECT count(*) FROM asyncq_jobs WHERE status IN ('pending', 'leased')") == [(4,)]


async def _finish_old_jobs(path: Path, count: int) -> None:
    async with await Queue.open(str(path), clock=Clock(wall_clock_ms() - 30 * DAY_MS)) as queue:
        for n in range(count):
            await queue.enqueue(f"big-{n}", {"pad": "x" * 4000})
        for ticket in await queue.claim("builder", limit=count):
            await queue.finish(ticket, "ok")


def test_prune_gives_space_back_on_a_file_made_by_init(tmp_path: Path) -> None:
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    asyncio.run(_finish_old_jobs(tmp_path / "q.db", 300))
    data = run_json("prune", "--db", "q.db", "--older-than", "1d", "--apply", cwd=tmp_path)
    assert data["deleted"] == 300 and data["vacuum"] == "incremental"
    assert data["bytes_after"] < data["bytes_before"] // 4
    assert (
        "space given back (incremental vacuum)"
        in run_cli("prune", "--db", "q.db", "--older-than", "1d", "--apply", cwd=tmp_path).stdout
    )


def test_prune_in_an_app_file_keeps_space_until_asked_to_vacuum(tmp_path: Path) -> None:
    """A queue added to an app's existing file cannot switch auto_vacuum on by itself: prune says so."""
    with closing(sqlite3.connect(tmp_path / "app.db")) as con:
        con.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")  # the app's table came first
    asyncio.run(_finish_old_jobs(tmp_path / "app.db", 50))
    kept = run_json("prune", "--db", "app.db", "--older-than", "1d", "--apply", cwd=tmp_path)
    assert kept["deleted"] == 50 and kept["vacuum"] == "skipped"
    assert rows(tmp_path / "app.db", "PRAGMA auto_vacuum") == [(0,)]
    full = run_json("prune", "--db", "app.db", "--older-than", "1d", "--apply", "--vacuum", cwd=tmp_path)
    assert full["deleted"] == 0 and full["vacuum"] == "full"
    assert rows(tmp_path / "app.db", "PRAGMA auto_vacuum") == [(2,)]


def test_backup_writes_a_checked_copy_and_refuses_to_overwrite(db: Path) -> None:
    data = run_json("backup", "--db", "q.db", "copy.db", cwd=db.parent)
    assert data["source"] == "q.db" and data["path"] == "copy.db" and data["check"] == "ok"
    assert data["jobs"] == EXPECTED_STATUS and data["bytes"] == data["pages"] * data["page_size"]
    assert run_json("status", "--db", "copy.db", cwd=db.parent)["by_status"] == EXPECTED_STATUS | {"waiting": 0}
    again = run_cli("backup", "--db", "q.db", "copy.db", cwd=db.parent)
    assert again.returncode == 1 and again.stderr == "asyncq: error: copy.db exists (use --force to replace it)\n"
    forced = run_cli("backup", "--db", "q.db", "copy.db", "--force", cwd=db.parent)
    assert forced.returncode == 0 and forced.stdout.startswith("backed up q.db to copy.db:")
    itself = run_cli("backup", "--db", "q.db", "q.db", "--force", cwd=db.parent)
    assert itself.returncode == 1 and "must not be the queue file itself" in itself.stderr
    assert sorted(p.name for p in db.parent.iterdir() if "partial" in p.name) == []


def test_backup_into_an_existing_directory_writes_the_queue_file_name_there(db: Path) -> None:
    (db.parent / "backups").mkdir()
    before = fingerprint(db)
    done = run_cli("backup", "--db", "q.db", "backups", cwd=db.parent)
    assert done.returncode == 0 and done.stderr == ""
    [line] = done.stdout.splitlines()
    assert line.startswith("backed up q.db to backups/q.db:")
    assert rows(db.parent / "backups" / "q.db", "SELECT count(*) FROM asyncq_jobs") == [(16,)]
    again = run_cli("backup", "--db", "q.db", "backups", cwd=db.parent)
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == "asyncq: error: backups/q.db exists (use --force to replace it)\n"
    assert run_json("backup", "--db", "q.db", "backups", "--force", cwd=db.parent)["path"] == "backups/q.db"
    assert sorted(p.name for p in (db.parent / "backups").iterdir()) == ["q.db"]
    assert fingerprint(db) == before


WRITER = """
import asyncio, sys
from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue

async def main() -> None:
    async with await Queue.open(sys.argv[1]) as queue:
        batch = 0
        while True:  # 50 jobs per transaction, until killed
            await queue.enqueue_many([JobSpec(f"w-{batch}-{n}", {"pad": "y" * 500}) for n in range(50)])
            batch += 1
            if batch == 20:
                print("writing", flush=True)

asyncio.run(main())
"""


def test_backup_while_a_writer_commits_is_a_consistent_snapshot(tmp_path: Path) -> None:
    assert run_cli("init", "--db", "q.db", cwd=tmp_path).returncode == 0
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, "q.db"], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        copies = [run_json("backup", "--db", "q.db", f"copy-{n}.db", cwd=tmp_path) for n in range(3)]
    finally:
        writer.kill()
        writer.wait(timeout=10)
    counts = []
    for n, data in enumerate(copies):
        assert data["check"] == "ok"
        [(jobs,)] = rows(tmp_path / f"copy-{n}.db", "SELECT count(*) FROM asyncq_jobs")
        assert rows(tmp_path / f"copy-{n}.db", "PRAGMA integrity_check") == [("ok",)]
        assert jobs == data["jobs"]["pending"] and jobs % 50 == 0  # whole transactions only
        counts.append(jobs)
    assert counts[0] >= 1000 and counts == sorted(counts)


def test_show_and_dead_print_the_errors_a_pool_kept(tmp_path: Path) -> None:
    """End to end: a pool's handler fails twice (the second time for good), and the command shows why."""

    async def fail_twice() -> None:
        from asyncq import Permanent, Pool, RetryPolicy

        async with await Queue.open(tmp_path / "q.db") as queue:
            await queue.enqueue("card-1", {"amount": 5}, max_attempts=3)
            calls = []

            async def charge(body: Any, context: Any) -> None:
                calls.append(context.attempt)
                if context.attempt == 1:
                    raise ConnectionError("gateway timed out")
                raise Permanent("card declined")

            pool = Pool(queue, retry=RetryPolicy(jitter=lambda: 0.0))
            pool.register("default", charge)
            for _ in range(2):
                await pool.run(burst=True)
            assert calls == [1, 2]

    asyncio.run(fail_twice())
    shown = run_json("show", "card-1", "--db", "q.db", cwd=tmp_path)
    errors = [(e["attempt"], e["type"], e["message"]) for e in shown["job"]["errors"]]
    assert errors == [(1, "ConnectionError", "gateway timed out"), (2, "asyncq.errors.Permanent", "card declined")]
    assert "card declined" in shown["job"]["errors"][1]["traceback"]
    text = run_cli("show", "card-1", "--db", "q.db", cwd=tmp_path).stdout
    assert "ConnectionError: gateway timed out" in text and "asyncq.errors.Permanent: card declined" in text
    dead = run_cli("dead", "--db", "q.db", cwd=tmp_path).stdout
    assert "card-1" in dead and "card declined" in dead
    listed = run_json("dead", "--db", "q.db", cwd=tmp_path)["jobs"]
    assert [job["last_error"]["message"] for job in listed] == ["card declined"]


def test_enqueue_takes_a_unique_key_and_reports_the_job_that_holds_it(db: Path) -> None:
    first = run_json("enqueue", "--db", "q.db", "u-1", "{}", "--unique-key", "digest:42", cwd=db.parent)
    assert (first["added"], first["held_by"]) == (1, {})
    second = run_json("enqueue", "--db", "q.db", "u-2", "{}", "--unique-key", "digest:42", cwd=db.parent)
    assert (second["added"], second["unchanged"], second["held_by"]) == (0, 0, {"u-2": "u-1"})
    text = run_cli("enqueue", "--db", "q.db", "u-3", "{}", "--unique-key", "digest:42", cwd=db.parent).stdout
    assert "u-3 (held by u-1)" in text
    lines = '{"id": "u-4", "body": 1, "unique_key": "other"}\n{"id": "u-5", "body": 2, "unique_key": "other"}\n'
    piped = run_json("enqueue", "--db", "q.db", cwd=db.parent, stdin=lines)
    assert (piped["added"], piped["held_by"]) == (1, {"u-5": "u-4"})
    assert rows(db, "SELECT id, unique_key FROM asyncq_jobs WHERE id LIKE 'u-%' ORDER BY id") == [
        ("u-1", "digest:42"),
        ("u-4", "other"),
    ]
    shown = run_cli("show", "--db", "q.db", "u-1", cwd=db.parent).stdout
    assert "unique_key" in shown and "digest:42" in shown
    listed = run_cli("jobs", "--db", "q.db", "--queue", "default", cwd=db.parent).stdout
    assert "unique key" in listed.splitlines()[0] and "digest:42" in listed
    bad = run_cli("enqueue", "--db", "q.db", "u-6", "{}", "--unique-key", " padded", cwd=db.parent)
    assert bad.returncode == 2 and "unique_key" in bad.stderr and bad.stderr.count("\n") == 1


def test_retention_is_set_per_state_shown_in_status_and_run_by_hand(db: Path) -> None:
    data = run_json("retention", "--db", "q.db", "default", "--done", "7d", "--by", "ops", cwd=db.parent)
    assert data["audit"]["action"] == "retention" and data["audit"]["actor"] == "ops"
    assert (data["audit"]["retain_done_ms"], data["audit"]["retain_dead_ms"]) == (7 * DAY_MS, None)
    both = run_json("retention", "--db", "q.db", "default", "--cancelled", "1d", cwd=db.parent)  # done stays 7d
    assert [both["audit"][f"retain_{s}_ms"] for s in ("done", "cancelled", "dead")] == [7 * DAY_MS, DAY_MS, None]
    shown = run_cli("status", "--db", "q.db", cwd=db.parent).stdout
    assert "retention rules (a job follows its task's in its queue" in shown and "queues without a rule keep" in shown
    assert re.search(r"queue default +7d\S* +1d\S* +forever", shown), shown
    queues = run_json("status", "--db", "q.db", cwd=db.parent)["queues"]
    assert [(q["queue"], q["retain_done_ms"], q["retain_cancelled_ms"]) for q in queues] == [
        ("default", 7 * DAY_MS, DAY_MS)
    ]
    run = run_json("retention", "--db", "q.db", "--run", cwd=db.parent)["run"]
    assert run["removed"] == [
        {"queue": "default", "task": None, "state": "cancelled", "jobs": 1},
        {"queue": "default", "task": None, "state": "done", "jobs": 3},
    ]
    assert run["total"] == 4
    left = {job_id for (job_id,) in rows(db, "SELECT id FROM asyncq_jobs WHERE status IN ('done', 'dead')")}
    assert {"d-1", "old-perm", "old-dl", "x-cancel"} <= left and not left & {"old-done-1", "old-cancel"}
    again = run_cli("retention", "--db", "q.db", "--run", cwd=db.parent)
    assert again.returncode == 0 and "removed 0 job(s)" in again.stdout
    for bad in (
        ("retention", "default"),
        ("retention", "default", "--done", "7x"),
        ("retention", "--run", "--done", "1d"),
        ("retention", "--task", "send", "--done", "1d"),
        ("retention", "default", "--default", "--done", "1d"),
        ("retention", "--default"),
        ("retention", "default", "--clear", "--done", "1d"),
        ("retention", "default", "--task", " send", "--done", "1d"),
        ("retention", "--clear"),
    ):
        refused = run_cli(*bad, "--db", "q.db", cwd=db.parent)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, (bad, refused.stderr)


def test_limits_are_set_flag_by_flag_shown_in_status_and_refused_with_one_line(db: Path) -> None:
    data = run_json("limits", "--db", "q.db", "default", "--concurrency", "4", "--per-key", "1", "--by", "ops",
                    cwd=db.parent)  # fmt: skip
    assert (data["audit"]["action"], data["audit"]["actor"]) == ("limits", "ops")
    assert (data["audit"]["limit_concurrency"], data["audit"]["limit_per_key"], data["audit"]["limit_rate"]) == (
        4, 1, None
    )  # fmt: skip
    rated = run_json(
        "limits", "--db", "q.db", "default", "--rate", "100", "--per", "60s", "--note", "provider", cwd=db.parent
    )["audit"]  # fmt: skip  (concurrency and per key stay as they were)
    assert [rated[f"limit_{name}"] for name in ("concurrency", "per_key", "rate", "per_ms", "burst")] == [
        4, 1, 100, 60_000, 1
    ]  # fmt: skip
    shown = run_json("limits", "--db", "q.db", cwd=db.parent)["limits"]
    assert [(q["queue"], q["concurrency"], q["rate"], q["slots_used"]) for q in shown] == [("default", 4, 100, 1)]
    status = run_cli("status", "--db", "q.db", cwd=db.parent).stdout
    assert "limits (leases live now" in status and "1/4" in status and "100 per 1m00s" in status
    assert run_json("status", "--db", "q.db", cwd=db.parent)["limits"][0]["per_key_concurrency"] == 1
    cleared = run_json("limits", "--db", "q.db", "default", "--rate", "none", cwd=db.parent)["audit"]
    assert (cleared["limit_concurrency"], cleared["limit_rate"], cleared["limit_per_ms"]) == (4, None, None)
    keyed = run_json("enqueue", "--db", "q.db", "t-1", "{}", "--limit-key", "tenant-7", cwd=db.parent)
    assert keyed["added"] == 1 and rows(db, "SELECT limit_key FROM asyncq_jobs WHERE id = 't-1'") == [("tenant-7",)]
    for bad in (
        ("limits", "--concurrency", "2"),
        ("limits", "default", "--concurrency", "0"),
        ("limits", "default", "--rate", "1.5"),
        ("limits", "default", "--per", "7x"),
        ("limits", "default", "--burst", "2"),  # no rate to shape
        ("enqueue", "t-2", "{}", "--limit-key", " padded"),
    ):
        refused = run_cli(*bad, "--db", "q.db", cwd=db.parent)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, (bad, refused.stderr)


def test_retention_per_task_and_a_default_set_listed_cleared_and_run(db: Path) -> None:
    """``--default`` and ``--task`` set the default's and a task's rule (a flag not given: as it applies now),
    ``asyncq retention`` alone lists the rules, ``--clear`` removes one (exit 1 with one line if there is none);
    a refused command writes nothing."""
    default = run_json("retention", "--db", "q.db", "--default", "--done", "30d", "--by", "ops", cwd=db.parent)
    assert (default["audit"]["queue"], default["audit"]["task"], default["default"]) == ("*", None, True)
    task = run_json("retention", "--db", "q.db", "mail", "--task", "send", "--dead", "1d", cwd=db.parent)
    assert (task["audit"]["queue"], task["audit"]["task"]) == ("mail", "send")
    assert [task["audit"][f"retain_{s}_ms"] for s in ("done", "cancelled", "dead")] == [30 * DAY_MS, None, DAY_MS]
    listed = run_json("retention", "--db", "q.db", cwd=db.parent)["rules"]
    assert [(rule["queue"], rule["task"], rule["retain_done_ms"], rule["retain_dead_ms"]) for rule in listed] == [
        (None, None, 30 * DAY_MS, None),
        ("mail", "send", 30 * DAY_MS, DAY_MS),
    ]
    shown = run_cli("retention", "--db", "q.db", cwd=db.parent).stdout
    assert "every queue (the default)" in shown and "task send in queue mail" in shown
    assert "task send in queue mail" in run_cli("status", "--db", "q.db", cwd=db.parent).stdout
    cleared = run_cli("retention", "--db", "q.db", "mail", "--task", "send", "--clear", cwd=db.parent)
    assert cleared.returncode == 0 and "cleared the rule of task send in queue mail" in cleared.stdout
    before = fingerprint(db)
    again = run_cli("retention", "--db", "q.db", "mail", "--task", "send", "--clear", cwd=db.parent)
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "has no retention rule" in again.stderr
    assert fingerprint(db) == before
    gone = run_json("retention", "--db", "q.db", "--default", "--clear", cwd=db.parent)
    assert gone["audit"]["action"] == "retention_clear"
    assert run_json("retention", "--db", "q.db", cwd=db.parent)["rules"] == []

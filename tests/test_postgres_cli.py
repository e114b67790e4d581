"""Every ``asyncq`` subcommand that takes ``--db`` on a PostgreSQL URL, as an operator runs it (real processes, the
machine's server, a schema of the test's own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli, run_json, run_many

from asyncq.store.postgres.schema import SCHEMA_VERSION as PG_SCHEMA_VERSION

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("postgres_database")]


def test_the_commands_work_on_a_postgresql_url(postgres_url: str, tmp_path: Path) -> None:
    missing = run_cli("status", "--db", postgres_url, cwd=tmp_path)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.count("\n") == 1 and "not an asyncq queue" in missing.stderr
    assert "no such queue schema" in run_cli("enqueue", "--db", postgres_url, "a", "{}", cwd=tmp_path).stderr
    created = run_json("init", "--db", postgres_url, cwd=tmp_path)
    assert (created["action"], created["store"], created["schema_version"]) == (
        "created",
        "postgresql",
        PG_SCHEMA_VERSION,
    )
    assert run_json("init", "--db", postgres_url, cwd=tmp_path)["action"] == "checked"
    lines = "".join(f'{{"id": "j{n}", "body": {{"n": {n}}}}}\n' for n in range(5))
    assert run_json("enqueue", "--db", postgres_url, cwd=tmp_path, stdin=lines)["added"] == 5
    assert run_json("cancel", "--db", postgres_url, "j0", "--note", "ops", cwd=tmp_path)["state"] == "cancelled"
    status, jobs, show, dead = run_many(
        [
            ["status", "--db", postgres_url, "--json"],
            ["jobs", "--db", postgres_url, "--json"],
            ["show", "--db", postgres_url, "j0", "--json"],
            ["dead", "--db", postgres_url, "--json"],
        ],
        cwd=tmp_path,
    )
    assert all(done.returncode == 0 for done in (status, jobs, show, dead)), status.stderr + jobs.stderr
    assert '"pending": 4' in status.stdout and '"dead": 1' in status.stdout
    assert jobs.stdout.count('"id": "j') == 5 and '"action": "cancel"' in show.stdout and '"j0"' in dead.stdout
    assert run_json("redrive", "--db", postgres_url, "j0", "--note", "again", cwd=tmp_path)["applied"] is True
    handler = tmp_path / "handlers.py"
    handler.write_text("async def noop(body, job):\n    return None\n")
    worked = run_cli("work", "--db", postgres_url, "--handler", "handlers:noop", "--burst", "--json", cwd=tmp_path)
    assert worked.returncode == 0 and '"done": 5' in worked.stdout, worked.stderr
    preview = run_json("prune", "--db", postgres_url, "--older-than", "0s", cwd=tmp_path)
    assert (preview["applied"], preview["count"]) == (False, 5)
    pruned = run_json("prune", "--db", postgres_url, "--older-than", "0s", "--apply", cwd=tmp_path)
    assert (pruned["deleted"], pruned["vacuum"], pruned["batches"]) == (5, "autovacuum", 2)
    refused = run_cli("backup", "--db", postgres_url, str(tmp_path / "copy"), cwd=tmp_path)
    assert (refused.returncode, refused.stdout) == (1, "") and refused.stderr.count("\n") == 1
    assert "pg_dump" in refused.stderr and not (tmp_path / "copy").exists()
    assert run_json("status", "--db", postgres_url, cwd=tmp_path)["total"] == 0


def test_a_bad_url_is_one_line_before_anything_connects(tmp_path: Path) -> None:
    for postgres_url, words in (
        ("postgresql://127.0.0.1:5432/postgres?schema=Bad", "schema must be"),
        ("postgresql://127.0.0.1:5432/postgres?wakeups=never", "wakeups must be"),
        ("postgresql://127.0.0.1:99999/postgres", "Port out of range"),
    ):
        done = run_cli("status", "--db", postgres_url, cwd=tmp_path)
        assert (done.returncode, done.stdout) == (1, "") and done.stderr.count("\n") == 1, done.stderr
        assert words in done.stderr and "Traceback" not in done.stderr

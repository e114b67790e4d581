"""Unique keys under concurrent enqueues from real processes (``tests/unique_children.py``), on a SQLite file and
on PostgreSQL: producers started together enqueue the same keys, each under ids of its own. Exactly one job per key
is stored, and every producer's answer for a key is that job (inserted by it, or the holder's id)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncq.queue import Queue

try:
    import unique_children
except ImportError:  # tests/ imported as a package
    from tests import unique_children

pytestmark = pytest.mark.timeout(90)

SCRIPT = Path(unique_children.__file__).resolve()
PRODUCERS = 4
KEYS = 40


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:  # only the ones this test started, by their own handle
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_producers(store: str, tmp_path: Path, procs: list[subprocess.Popen[str]]) -> dict[str, object]:
    for n in range(PRODUCERS):
        argv = [sys.executable, str(SCRIPT), "--store", store, "--name", f"p{n}", "--keys", str(KEYS)]
        errors = open(tmp_path / f"p{n}.stderr", "w")  # noqa: SIM115 (closed with the process below)
        procs.append(subprocess.Popen(argv, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=errors, text=True))  # fmt: skip
        errors.close()
    for proc in procs:  # every child has its store open: then all start at once
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", _stderr(tmp_path)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results: dict[str, object] = {}
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, _stderr(tmp_path)
        results |= json.loads(out)
    return results


def _stderr(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(tmp_path.glob("*.stderr")))


def check(results: dict[str, object], stored: dict[str, tuple[str, str | None]]) -> None:
    assert len(results) == PRODUCERS * KEYS
    assert sorted(key for _status, key in stored.values()) == sorted(f"k{i}" for i in range(KEYS))
    assert {status for status, _key in stored.values()} == {"pending"}
    holder = {key: job_id for job_id, (_status, key) in stored.items()}
    for job_id, result in results.items():
        key = job_id.split("-", 1)[1]
        assert result is True if job_id == holder[key] else result == holder[key], (job_id, result, holder[key])


async def stored_jobs(target: str) -> dict[str, tuple[str, str | None]]:
    async with await Queue.open(target) as queue:
        return {job.id: (job.status, job.unique_key) for job in await queue.list_jobs(limit=1000, body=False)}


def test_concurrent_producers_on_sqlite_store_one_job_per_key(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    db = str(tmp_path / "queue.db")
    asyncio.run(stored_jobs(db))  # created (and migrated) once, before the race
    check(run_producers(db, tmp_path, children), asyncio.run(stored_jobs(db)))


def test_concurrent_producers_on_postgresql_store_one_job_per_key(
    tmp_path: Path, children: list[subprocess.Popen[str]], postgres_url: str
) -> None:
    asyncio.run(stored_jobs(postgres_url))
    check(run_producers(postgres_url, tmp_path, children), asyncio.run(stored_jobs(postgres_url)))

"""Shared fixtures: a queue file path in ``tmp_path``, a lease-lab connection on it, a clock the test moves (the
async facade's tests), and a filled queue file copied per test (the command line's tests)."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cli_support import build_queue
from messaging_support import place  # noqa: F401  (an outbox's and an inbox's stores on each driver)
from pg_cluster_support import cluster  # noqa: F401  (a PostgreSQL cluster of the test's own)
from pgbouncer_support import pgbouncer  # noqa: F401  (this run's PgBouncer in transaction mode)
from postgres_support import drop_run_database, postgres_database, postgres_url  # noqa: F401  (this run's database, a fresh schema)

from asyncq import Queue
from asyncq.lab.lease import open_queue

#: The queue clock's starting time in the tests (ms since the epoch, November 2023).
T0 = 1_700_000_000_000


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "queue.db"


@pytest.fixture
def con(path: Path) -> Iterator[sqlite3.Connection]:
    """A lease-lab connection from ``open_queue`` on ``path``, closed after the test."""
    connection = open_queue(path)
    yield connection
    connection.close()


@pytest.fixture
def clock() -> list[int]:
    """``clock[0]`` is the queue's time: tests move it instead of sleeping."""
    return [T0]


@pytest.fixture
async def queue(path: Path, clock: list[int]) -> AsyncIterator[Queue]:
    async with await Queue.open(str(path), clock=lambda: clock[0]) as opened:
        yield opened


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A queue file with jobs in every state, built once (see ``cli_support.build_queue``)."""
    path = tmp_path_factory.mktemp("template") / "q.db"
    build_queue(path)
    return path


@pytest.fixture
def db(tmp_path: Path, template: Path) -> Path:
    """A fresh copy of ``template`` for one test to change."""
    return fresh_copy(template, tmp_path / "q.db")


def fresh_copy(template: Path, destination: Path) -> Path:
    """``template`` copied to ``destination`` (a file built once, for one test to change); the copy's path."""
    shutil.copyfile(template, destination)
    return destination


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """This run's PostgreSQL database is dropped once every test has ended, outside any test's timeout: dropped in
    the session fixture's teardown, it counted against the last test's (30 s in ``test_tasks.py``), and beside two
    other runs on the same server it once took longer."""
    drop_run_database()

"""Helpers for tests on the machine's real PostgreSQL (127.0.0.1:5432, user postgres, trust; ``ASYNCQ_TEST_POSTGRES``
names another server).

A run makes its own database (``run_database``, dropped by the session fixture ``postgres_database`` at the end)
and each test its own schema in it (``fresh_schema``), dropped after the test: runs and tests never see each
other's rows. When the server cannot be reached a test is skipped with the reason, except under ``CI=true``,
where that is a failure (``rabbit_support.unavailable``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest
from rabbit_support import unavailable

T = TypeVar("T")

SERVER_URL = os.environ.get("ASYNCQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def run_in_thread(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end on an event loop of its own, in another thread, and return its result: for
    synchronous test factories called from inside a test's running loop (``Driver.force``)."""
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["value"] = asyncio.run(_awaited(make))
        except BaseException as error:  # re-raised in the caller's thread
            box["error"] = error

    thread = threading.Thread(target=main, name="postgres-test-helper")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


async def execute(url: str, statement: str, *args: Any) -> str:
    """One statement on a connection of its own (autocommit); its status text."""
    import asyncpg

    conn = await asyncpg.connect(url, timeout=5)
    try:
        return await conn.execute(statement, *args)
    finally:
        await conn.close()


@functools.cache
def server_problem() -> str | None:
    """``None`` if the test server answers, else why not (asked once a run)."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed (pip install -e '.[dev]')"
    try:
        run_in_thread(lambda: execute(SERVER_URL, "SELECT 1"))
    except Exception as error:
        return f"PostgreSQL is unreachable at {urlsplit(SERVER_URL).netloc}: {type(error).__name__}: {error}"
    return None


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


@functools.cache
def run_database() -> str:
    """The URL of this run's own database, created on first use (``CREATE DATABASE`` costs ≈ 0.1-0.5 s: once)."""
    name = f"asyncq_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    run_in_thread(lambda: execute(SERVER_URL, f"CREATE DATABASE {name}"))
    _created.append(name)
    return with_database(SERVER_URL, name)


_created: list[str] = []


def drop_run_database() -> None:
    """Drop this run's database if it was made (its connections are ended first)."""
    while _created:
        name = _created.pop()
        run_in_thread(lambda name=name: execute(SERVER_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    run_database.cache_clear()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """This run's database URL (skip, or fail under CI, if the server does not answer); dropped when the session
    ends (``conftest.pytest_sessionfinish``)."""
    problem = server_problem()
    if problem is not None:
        unavailable(problem)
    yield run_database()


def new_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


def queue_url(database_url: str, schema: str, **options: str) -> str:
    """The store URL of a queue in ``schema``, whose connections also resolve the app's unqualified tables there
    (``search_path``): a test's own tables go with its schema."""
    query = "&".join([f"schema={schema}", f"search_path={schema}", *(f"{k}={v}" for k, v in options.items())])
    return f"{database_url}?{query}"


@asynccontextmanager
async def fresh_schema(**options: str) -> AsyncIterator[tuple[str, str]]:
    """``(store URL, schema)`` of a schema no one has used, dropped with everything in it after the block."""
    database = run_database()
    schema = new_schema_name()
    try:
        yield queue_url(database, schema, **options), schema
    finally:
        await execute(database, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
async def postgres_url(postgres_database: str) -> AsyncIterator[str]:
    """A store URL of a fresh schema in this run's database (dropped with everything in it after the test)."""
    async with fresh_schema() as (found, _schema):
        yield found

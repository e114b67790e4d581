"""Through the run's real PgBouncer (transaction mode, Debian's defaults: ``tests/pgbouncer_support.py``): a store URL
without ``?wakeups=poll`` is refused at open with a line that says what to add, and nothing is created; with it, a
queue opens, takes jobs and a pool drains them (the conformance suite runs the rest through it as
``postgresql-pgbouncer``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pgbouncer_support import Bouncer, schema_alias
from postgres_support import fresh_schema

from asyncq import JobSpec, Pool, Queue
from asyncq.errors import StoreError


@pytest.fixture
async def alias(pgbouncer: Bouncer, postgres_database: str) -> AsyncIterator[tuple[Bouncer, str, str, str]]:
    """``(bouncer, alias, schema, server URL)``: a fresh schema reached through PgBouncer (``schema_alias``)."""
    async with fresh_schema() as (url, schema), schema_alias(pgbouncer, url, schema) as name:
        yield pgbouncer, name, schema, url.split("?")[0]


async def schemas(server: str, schema: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(server, timeout=5)
    try:
        found: int = await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)
        return found
    finally:
        await conn.close()


async def test_a_url_without_wakeups_poll_is_refused_at_open_saying_what_to_add(
    alias: tuple[Bouncer, str, str, str],
) -> None:
    bouncer, name, schema, server = alias
    with pytest.raises(StoreError, match=r"connection pooler .* add \?wakeups=poll to the URL") as raised:
        await Queue.open(bouncer.url(name, schema=schema))
    assert "\n" not in str(raised.value)  # one line, for the CLI
    assert await schemas(server, schema) == 0  # nothing was created


async def test_with_wakeups_poll_a_pool_drains_jobs_through_it(alias: tuple[Bouncer, str, str, str]) -> None:
    bouncer, name, schema, _server = alias
    async with await Queue.open(bouncer.url(name, schema=schema, wakeups="poll")) as queue:
        await queue.enqueue_many([JobSpec(f"b-{n}", {"n": n}) for n in range(200)])
        seen: list[int] = []
        pool = Pool(queue, concurrency=8, poll_max=0.05)

        @pool.handler()
        async def handle(body: dict[str, int], context: object) -> None:
            seen.append(body["n"])

        await pool.run(burst=True)
        assert sorted(seen) == list(range(200))
        assert (await queue.stats()).by_status["done"] == 200

"""The PostgreSQL schema's schedules version (9) taken from version 8 with rows in it: jobs and queue settings stay as
they were, and the schedule tables work at once. (The SQLite file's version 12 is tested with the driver's other
migrations, ``tests/conformance/test_sqlite_driver.py``.)"""

from __future__ import annotations

import asyncpg
import pytest

from asyncq import Queue
from asyncq.core.schedules import ScheduleSpec
from asyncq.store.postgres.connection import Migrations, migrate, parse_url
from asyncq.store.postgres.schema import QUEUE, SCHEMA_VERSION

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("postgres_database")]

T0 = 1_700_000_000_000


async def test_a_version_8_schema_with_jobs_and_settings_gains_the_schedule_tables(postgres_url: str) -> None:
    target = parse_url(postgres_url)
    conn = await asyncpg.connect(target.dsn)
    try:
        assert SCHEMA_VERSION >= 9
        await migrate(conn, target.schema, Migrations("queue", QUEUE.steps[:8]))
        await conn.execute(
            f"INSERT INTO {target.schema}.jobs (id, queue, body, status, attempts, max_attempts, token, available_at,"
            " deadline) VALUES ('old', 'default', '{}', 'pending', 0, 3, 0, 0, 9999999999999)"
        )
        await conn.execute(f"INSERT INTO {target.schema}.queues (queue, max_wait_ms) VALUES ('default', 60000)")
    finally:
        await conn.close()
    async with await Queue.open(postgres_url, clock=lambda: T0) as queue:
        assert (await queue.describe())["schema_version"] == SCHEMA_VERSION
        assert (await queue.get("old")) is not None and (await queue.queue_settings())[0].max_wait_ms == 60000
        [event] = await queue.declare_schedules([ScheduleSpec("beat", {}, every=10)])
        assert event.kind == "declared"
        [schedule] = await queue.schedules()
        assert (schedule.name, schedule.next_tick) == ("beat", T0 + 10_000)

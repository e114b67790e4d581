"""A console action on PostgreSQL against another host's transaction: the action locks its set's rows before it
checks them, so a claim that commits while the action waits for a row is seen, and the action is refused
(``SetChanged``) with nothing changed, instead of acting on a set its operator never saw."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import asyncpg
import pytest
from waiting import eventually

from asyncq.core.jobs import JobSpec
from asyncq.core.operations import OPERATOR, AuditQuery, Operation
from asyncq.core.search import JobQuery
from asyncq.errors import SetChanged
from asyncq.queue import Queue
from asyncq.queue.console import OperatorConsole
from asyncq.store.postgres.connection import parse_url

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("postgres_database")]

T0 = 1_700_000_000_000


async def test_a_claim_committed_while_the_action_waits_for_its_rows_makes_it_refuse(postgres_url: str) -> None:
    target = parse_url(postgres_url)
    async with await Queue.open(postgres_url, clock=lambda: T0) as queue:
        await queue.enqueue_many([JobSpec("a", 1), JobSpec("b", 2)])
        console = OperatorConsole(queue)
        preview = await console.preview("cancel", JobQuery())
        assert preview.count == 2
        other = await asyncpg.connect(target.dsn)
        try:
            held = other.transaction()
            await held.start()
            await other.execute(  # another host's claim of b, not committed yet
                f"UPDATE {target.schema}.jobs SET status = 'leased', token = token + 1, attempts = 1, owner = 'w9',"
                f" lease_until = {T0 + 60_000} WHERE id = 'b'"
            )
            operation = Operation("cancel", 2, preview.digest, "ada", OPERATOR, "stop them", JobQuery())
            acting = asyncio.create_task(console.operate(operation))
            database = urlsplit(target.dsn).path.lstrip("/")
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = $1"
            await eventually(lambda: other.fetchval(waiting, database), "the action waiting for b's row", timeout=10)
            await held.commit()
            with pytest.raises(SetChanged, match="same count but members in another state"):
                await acting
        finally:
            await other.close()
        a, b = await queue.get("a"), await queue.get("b")
        assert a is not None and (a.status, a.cancel_requested_at) == ("pending", None)
        assert b is not None and (b.status, b.owner, b.cancel_requested_at) == ("leased", "w9", None)
        assert await queue.history("a") == [] and await queue.history("b") == []
        assert (await console.audit(AuditQuery()))[0] == []

"""The README's outbox lines on PostgreSQL: the app's own asyncpg transaction carries its order's change and the
event; a relay delivers the event to a receiver on 127.0.0.1 whose inbox is on PostgreSQL too, and the receiver's
effect (a ``shipments`` row) commits with its inbox row, once.

``python examples/postgres_outbox.py postgresql://user@host:5432/db [APP_URL]`` (the outbox and the inbox go into
schema ``asyncq`` unless the URL says ``?schema=…``; the app's tables into ``APP_URL``'s connection's own). Runs
again on the same database: the event exists already (``add`` is ``False``), so nothing is sent or applied twice.
"""

import asyncio
import sys
from typing import Any

import asyncpg
from aiohttp import web

from asyncq import HttpTransport, Outbox, Relay
from asyncq.inbox import INBOX_KEY, EffectTransaction, make_inbox_app

SHIPMENTS = ("CREATE TABLE IF NOT EXISTS shipments (event text PRIMARY KEY, order_id text NOT NULL)",)


def ship(tx: EffectTransaction, event_id: str, body: Any) -> None:
    """The receiver's effect, in the transaction that records the event in its inbox."""
    tx.execute("INSERT INTO shipments (event, order_id) VALUES ($1, $2)", (event_id, body["order"]))


async def main(url: str, app_url: str) -> None:
    outbox = await Outbox.open(url)
    conn = await asyncpg.connect(app_url)
    receiver = web.AppRunner(make_inbox_app(url, effect=ship, ddl=SHIPMENTS), access_log=None)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, state text NOT NULL)")
        await conn.execute("INSERT INTO orders VALUES ('order-1', 'new') ON CONFLICT DO NOTHING")
        async with conn.transaction():  # the event commits or rolls back with your rows; the relay sends it in order
            await conn.execute("UPDATE orders SET state = 'paid' WHERE id = $1", "order-1")
            await outbox.add("order-1-paid", {"order": "order-1"}, topic="orders", connection=conn)

        await receiver.setup()
        await web.TCPSite(receiver, "127.0.0.1", 0).start()
        transport = HttpTransport(f"http://127.0.0.1:{receiver.addresses[0][1]}/events")
        relay = Relay(outbox, transport)
        try:
            print(await relay.run_once())  # one pass: every waiting event, in order
        finally:
            await relay.release()
            await transport.close()
        print("inbox", await receiver.app[INBOX_KEY].totals())
    finally:
        await receiver.cleanup()
        await conn.close()
        await outbox.close()


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1:5432/postgres"
    asyncio.run(main(target, sys.argv[2] if len(sys.argv) > 2 else target.split("?")[0]))

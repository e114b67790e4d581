"""The README's PostgreSQL lines: the app's own asyncpg transaction carries its order row and the job, then a pool
drains the queue. ``python examples/postgres_quickstart.py postgresql://user@host:5432/db`` (the queue goes into
schema ``asyncq`` unless the URL says ``?schema=…``; the app's ``orders`` table into the connection's own).

Runs again on the same database: the order row and the job are each added once (``ON CONFLICT DO NOTHING``, and an
``enqueue`` of an existing id with the same body adds nothing), so a second run ships nothing new.
"""

import asyncio
import sys

import asyncpg

from asyncq import JSON, JobContext, Pool, Queue


async def main(url: str, app_url: str) -> None:
    queue = await Queue.open(url)  # was: Queue.open("queue.db")
    conn = await asyncpg.connect(app_url)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, qty integer)")
        async with conn.transaction():  # your own asyncpg connection: the job commits or rolls back with your rows
            await conn.execute("INSERT INTO orders VALUES ($1, $2) ON CONFLICT DO NOTHING", "order-1", 7)
            await queue.enqueue("ship-order-1", {"order": "order-1"}, connection=conn)

        pool = Pool(queue, concurrency=4)

        @pool.handler()
        async def ship(body: JSON, job: JobContext) -> None:
            print("shipping", body)

        await pool.run(burst=True)  # drain, then return
        print(await queue.get("ship-order-1"))
    finally:
        await conn.close()
        await queue.close()


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1:5432/postgres"
    asyncio.run(main(target, sys.argv[2] if len(sys.argv) > 2 else target.split("?")[0]))

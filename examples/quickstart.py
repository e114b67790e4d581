"""The README's quickstart: enqueue with your own rows in one transaction, then drain with a pool.

Runs again on the same file: the order row and the job are each added once (``INSERT OR IGNORE``, and an
``enqueue`` of an existing id with the same body adds nothing), so a second run ships nothing new.
"""

import asyncio
import sys
import tempfile

from asyncq import JSON, JobContext, Pool, Queue


async def main(path: str) -> None:
    async with await Queue.open(path) as queue:
        async with queue.transaction() as tx:  # your rows and the job commit together
            await tx.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, qty INT)")
            await tx.execute("INSERT OR IGNORE INTO orders VALUES ('order-1', 7)")
            await tx.enqueue("ship-order-1", {"order": "order-1", "qty": 7})

        pool = Pool(queue, concurrency=4)

        @pool.handler()
        async def ship(body: JSON, job: JobContext) -> None:
            print("shipping", body)  # raise asyncq.Retryable / asyncq.Permanent to steer

        await pool.run(burst=True)  # drain, then return
        print(await queue.get("ship-order-1"))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp() + "/app.db"))

"""Tasks the way the issue writes them: ``@app.task`` at module level, typed ``defer``, a key, a delay, a deferral in
the app's own transaction, and a worker (``python examples/tasks.py app.db``; or defer here and run
``asyncq worker tasks:app --db app.db`` from this directory).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

from pydantic import BaseModel

import asyncq

app = asyncq.App()


class Receipt(BaseModel):
    to: str
    subject: str
    urgent: bool


@app.task(queue="emails", max_attempts=5, timeout=30.0)
async def send_email(to: str, subject: str, *, urgent: bool = False) -> Receipt:
    """Send one email (here: print it) and say what was sent."""
    print(f"sending {subject!r} to {to}{' (urgent)' if urgent else ''}")
    return Receipt(to=to, subject=subject, urgent=urgent)


async def main(path: str) -> None:
    async with asyncq.open(path) as queue:  # a path (one async with, no await)
        job = await send_email.defer(queue, to="a@b.example", subject="hi")
        welcome = await send_email.using(key="welcome-42", delay=0.2).defer(queue, to="c@d.example", subject="welcome")
        async with queue.transaction() as tx:  # the app's rows and the job commit together
            await tx.execute("CREATE TABLE IF NOT EXISTS signups (email TEXT PRIMARY KEY)")
            await tx.execute("INSERT OR IGNORE INTO signups VALUES ('e@f.example')")
            await send_email.defer(tx, to="e@f.example", subject="thanks", urgent=True)
        worker = asyncio.create_task(app.run_worker(queue, concurrency=16))
        try:
            receipt = await job.result(timeout=10.0)
            print("receipt:", receipt)
            print("welcome:", await welcome.result(timeout=10.0))
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(main(f"{directory}/app.db"))

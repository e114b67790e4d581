"""A worker that claims one job, says so, takes a moment, delivers it over HTTP and finishes it.

Run by tests/test_stale_worker.py, which freezes it with SIGSTOP right after the claim.
    python tests/stale_worker_child.py DB URL OWNER LEASE_MS
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncq import Queue
from asyncq.delivery.http import HttpTransport


async def main(db: str, url: str, owner: str, lease_ms: int) -> None:
    queue = await Queue.open(db)
    transport = HttpTransport(url, timeout=5.0)
    [ticket] = await queue.claim(owner, lease=lease_ms / 1000)
    print(json.dumps({"claimed": ticket.id, "token": ticket.token}), flush=True)
    await asyncio.sleep(0.3)  # the window in which the test freezes this process
    await transport.deliver(ticket.id, ticket.body, {"Asyncq-Token": str(ticket.token)})
    status = await queue.finish(ticket, "ok")
    print(json.dumps({"delivered": ticket.id, "finish": status}), flush=True)
    await transport.close()
    await queue.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))

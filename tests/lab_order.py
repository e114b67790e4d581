"""Where the lease lab's claim order and the product's differ, by design: the lab's contract claims the oldest
``seq`` first; a product queue claims by priority, then by the time a job became ready, then ``seq``
(``asyncq.core.claim_plan.claim_rank``; docs/flow-control.md). The histories that compare the two skip a claim
whose pick the orders disagree on (the product's order has conformance tests of its own: ``test_priorities.py``)."""

from __future__ import annotations

import sqlite3

# The lab's rows a claim at ``:now`` could take once its sweep ran: ready (pending and available, or an expired
# lease), deadline not passed, attempts left.
CLAIMABLE = """
SELECT seq, available_at FROM jobs
WHERE ((status = 'pending' AND available_at <= :now) OR (status = 'leased' AND lease_until <= :now))
  AND deadline > :now AND attempts < max_attempts
"""


def orders_agree(lab: sqlite3.Connection, now_ms: int) -> bool:
    """Whether the lab's next claim at ``now_ms`` takes the job the product's order would (every priority is 0)."""
    rows = lab.execute(CLAIMABLE, {"now": now_ms}).fetchall()
    return not rows or min(rows)[0] == min(rows, key=lambda row: (row[1], row[0]))[0]

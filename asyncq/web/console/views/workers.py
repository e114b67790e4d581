"""The Workers screen: who holds leases now (by owner: how many, which jobs, the soonest and latest expiry, cancel
requests waiting for their renewal), and every lease holder the samples saw (first and last seen, the renewals
seen, the last one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asyncq.core.jobs import Job
from asyncq.core.search import JobQuery, Order
from asyncq.web.console.http import Response

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

#: Leases listed with their jobs, at most (the counts by owner are exact whatever their number).
LEASES_LISTED = 200


@dataclass
class Holder:
    """One owner's leases now."""

    owner: str
    count: int
    first_expiry_ms: int
    jobs: list[Job] = field(default_factory=list)

    @property
    def last_expiry_ms(self) -> int | None:
        return max((job.lease_until or 0 for job in self.jobs), default=None)

    @property
    def cancels(self) -> int:
        return sum(job.cancel_requested_at is not None for job in self.jobs)


async def page(ctx: Ctx) -> Response:
    return ctx.render("workers.html", **await values(ctx))


async def values(ctx: Ctx) -> dict[str, Any]:
    stats = await ctx.console.totals()
    holders = {lease.owner: Holder(lease.owner, lease.count, lease.first_expiry_ms) for lease in stats.leases}
    listed = await ctx.console.search(JobQuery(status="leased"), order=Order.OLDEST, page=LEASES_LISTED)
    for job in listed.jobs:
        if job.owner in holders:
            holders[job.owner].jobs.append(job)
    return {
        "holders": sorted(holders.values(), key=lambda holder: holder.owner),
        "leased": stats.by_status.get("leased", 0),
        "expired": stats.expired_leases,
        "listed": LEASES_LISTED,
        "seen": await ctx.console.workers_seen(),
        "sampling": ctx.app.settings.sample_seconds,
    }

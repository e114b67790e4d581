"""The console's job search through the port (``ConsoleStore.search``) on every driver: whatever the path, the
cap on rows scanned and the page size, walking every page from the start finds exactly the jobs
``JobQuery.matches`` defines, in the plan's order, each page within its bounds; the dead jobs' groups."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from asyncq.core.jobs import Job
from asyncq.core.operations import Selection
from asyncq.core.search import BodyMatch, JobQuery, Order, Path, SearchPlan, decode_cursor, plan_search
from asyncq.store.port.queue import JobFilter, QueueStore

from .support import ALL, BOOM, DOOM, T0, claim, enqueue, new, outcome

pytestmark = pytest.mark.timeout(60)


async def varied(store: QueueStore) -> dict[str, frozenset[str]]:
    """Jobs in two queues, every status, three priorities, failures of two types, bodies with a path, a fifth of them
    tasks' (``send`` or ``report``); jobs waiting for a pending one (two of them tasks'); returns each job's error
    types."""
    rows = []
    for n in range(24):
        queue = ("mail", "web")[n % 2]
        body: dict[str, Any] = {"customer": {"id": n % 3, "tier": ("gold", "free")[n % 2]}, "tags": ["a", n]}
        if n % 5 == 0:
            body = {"task": ("send", "report")[n % 2], "args": body}
        rows.append(new(f"j{n:02}", T0 + n, queue=queue, body=body, priority=(n % 3) - 1, delay_ms=(n % 4) * 1000))
    await enqueue(store, *rows)
    waiting = [new("later", T0, queue="ops")]  # never claimed: its dependants wait
    for n in range(4):
        body = {"task": "send", "args": {"n": n}} if n % 2 else {"n": n}
        waiting.append(new(f"w{n}", T0 + n, queue=("mail", "ops")[n % 2], body=body, after=["later"]))
    await enqueue(store, *waiting)
    now = T0 + 10_000
    for queue in ("mail", "web"):
        tickets = await claim(store, "w1", now, queue=queue, n=8)
        finishes = []
        for k, ticket in enumerate(tickets):
            kind = ("ok", "permanent", "retry", "retry", "ok", "permanent", "ok", "keep")[k]
            if kind != "keep":
                error = None if kind == "ok" else (BOOM if k % 2 else DOOM)
                finishes.append(outcome(ticket, kind, 0, error=error))
        await store.finish(finishes, now + 1)
    jobs = await store.list_jobs(JobFilter(limit=ALL))
    types: dict[str, frozenset[str]] = {}
    for job in jobs:
        record = await store.get(job.id)
        assert record is not None
        types[job.id] = frozenset(error.type for error in record.errors)
    return types


def expected(jobs: list[Job], types: dict[str, frozenset[str]], plan: SearchPlan) -> list[str]:
    found = [job for job in jobs if plan.query.matches(job, types[job.id])]
    if plan.statuses is not None:
        found = [job for job in found if job.status in plan.statuses]
    if plan.order is Order.DUE:
        found.sort(key=lambda job: (job.available_at, job.seq))
    else:
        found.sort(key=lambda job: job.seq, reverse=plan.order is Order.NEWEST)
    return [job.id for job in found]


async def walk_all(store: QueueStore, plan: SearchPlan, page: int, scan: int) -> list[str]:
    """Every page from the start, following ``next``."""
    console = store.console()
    found: list[str] = []
    after = None
    for _ in range(200):
        result = await console.search(plan, after, page, scan)
        assert len(result.jobs) <= page
        assert result.scanned is None or result.scanned <= scan
        assert result.capped == (result.scanned is not None and result.scanned >= scan)
        found += [job.id for job in result.jobs]
        if result.next is None:
            return found
        after = decode_cursor(result.next, plan)
    raise AssertionError("the walk did not end")


QUERIES = [
    JobQuery(),
    JobQuery(status="dead"),
    JobQuery(status="leased"),
    JobQuery(status="pending", queue="mail"),
    JobQuery(status="done", queue="web"),
    JobQuery(queue="web", priority=1),
    JobQuery(error_type="ValueError"),
    JobQuery(error_type="app.Doomed", status="dead"),
    JobQuery(status="dead", reason="permanent"),
    JobQuery(since_ms=T0 + 2_000, until_ms=T0 + 4_000),
    JobQuery(body=BodyMatch(("customer", "tier"), "gold")),
    JobQuery(body=BodyMatch(("customer", "id"), 2), status="pending"),
    JobQuery(body=BodyMatch(("tags", 1), 7)),
    JobQuery(body=BodyMatch(("tags", 0), "a"), queue="mail"),
    JobQuery(ids=("j03", "j05", "j07", "nope")),
    JobQuery(task="send"),
    JobQuery(task="report", status="done"),
    JobQuery(task="send", queue="mail", status="pending"),
    JobQuery(task="nobody"),
    JobQuery(status="waiting"),
    JobQuery(status="waiting", queue="ops", task="send"),
]


@pytest.mark.parametrize("query", QUERIES, ids=[str(n) for n in range(len(QUERIES))])
async def test_every_page_of_a_search_finds_exactly_what_the_query_defines(store: QueueStore, query: JobQuery) -> None:
    types = await varied(store)
    jobs = await store.list_jobs(JobFilter(limit=ALL))
    for order in (Order.NEWEST, Order.OLDEST):
        plan = plan_search(query, order)
        if query.task is not None and query.status is None:
            assert plan.path is Path.TASK and plan.served == ("task",)
        if query.status == "waiting":
            assert plan.path is Path.WAITING
        wanted = expected(jobs, types, plan)
        for page, scan in ((100, 10_000), (3, 3), (2, 5), (1, 1)):
            assert await walk_all(store, plan, page, scan) == wanted, (order, page, scan, plan.path)


@pytest.mark.parametrize(
    "query",
    [
        JobQuery(status="pending", queue="mail"),
        JobQuery(status="pending", queue="web", priority=-1),
        JobQuery(status="pending", queue="mail", since_ms=T0 + 2_000, until_ms=T0 + 10_002),
    ],
)
async def test_one_queues_pending_jobs_list_by_when_they_are_due(store: QueueStore, query: JobQuery) -> None:
    types = await varied(store)
    jobs = await store.list_jobs(JobFilter(limit=ALL))
    plan = plan_search(query, Order.DUE)
    assert plan.path is Path.DUE and set(plan.served) >= {"status", "queue"}
    wanted = expected(jobs, types, plan)
    assert wanted
    for page, scan in itertools.product((1, 2, 50), (1, 4, 10_000)):
        if scan >= page:
            assert await walk_all(store, plan, page, scan) == wanted


async def test_a_bulk_selection_is_its_statuses_oldest_first(store: QueueStore) -> None:
    types = await varied(store)
    jobs = await store.list_jobs(JobFilter(limit=ALL))
    plan = plan_search(JobQuery(queue="mail"), Order.OLDEST, ("pending", "waiting", "leased"))
    found = await store.console().select("cancel", JobQuery(queue="mail"), T0)
    assert [job.id for job in found.jobs] == expected(jobs, types, plan) and not found.capped and not found.spared
    assert all(job.body is None for job in found.jobs)
    assert plan_search(JobQuery(status="done"), Order.OLDEST, ("dead",)).empty
    assert await store.console().select("redrive", JobQuery(status="done"), T0) == Selection([], False)


async def test_dead_jobs_group_by_queue_reason_and_newest_error_type(store: QueueStore) -> None:
    types = await varied(store)
    jobs = [job for job in await store.list_jobs(JobFilter(status="dead", limit=ALL))]
    groups, looked = await store.console().dead_groups(None, 10_000)
    assert looked == len(jobs) > 0
    reference: dict[tuple[str, str, str | None], list[Job]] = {}
    for job in jobs:
        record = await store.get(job.id)
        assert record is not None
        last = record.last_error.type if record.last_error else None
        reference.setdefault((job.queue, job.reason or "", last), []).append(job)
    got = {(g.queue, g.reason, g.error_type): (g.count, g.newest_id) for g in groups}
    assert got == {key: (len(found), max(found, key=lambda j: j.seq).id) for key, found in reference.items()}
    mail, looked = await store.console().dead_groups("mail", 1)
    assert looked == 1 and sum(g.count for g in mail) <= 1
    assert types  # the fixture made failures

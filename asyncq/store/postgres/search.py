"""The console's job search on PostgreSQL: each path of ``core.search`` as one bounded walk of its index, and the
page read from what it yielded (the filters the path does not serve checked on those rows only), the SQLite
driver's statements in PostgreSQL's words.

A page is one statement in the caller's snapshot: the walk (at most ``:scan`` rows of the path's index, in its
order, past the cursor) is a subquery whose order the outer query keeps (its sort keys are the walk's), each row's
job is fetched by its primary key in a ``LATERAL`` subquery that checks the unserved filters (its ``LIMIT 1`` keeps
the planner from folding it into a join: for a selective filter it then scanned the whole table and merged), and
the ``LIMIT`` stops the walk once the page is full. Only a short page asks how far the walk went.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from asyncq.core.jobs import AttemptError, Job
from asyncq.core.lifecycle import STATUSES
from asyncq.core.search import JobPage, Order, Path, Position, SearchPlan, encode_cursor, position_of
from asyncq.store.postgres.admin import JOB_COLUMNS, JOB_EXTRAS, LAST_ERRORS
from asyncq.store.postgres.connection import Connection

_COLUMNS = ", ".join(f"j.{column}" for column in JOB_COLUMNS.split(", ")) + ", " + JOB_EXTRAS
_WALKS = {
    Path.SEQ: "SELECT seq FROM {schema}.jobs WHERE seq {cmp} :after ORDER BY seq {dir} LIMIT :scan",
    Path.DEAD: "SELECT seq FROM {schema}.jobs WHERE status = 'dead' AND seq {cmp} :after"
    " ORDER BY seq {dir} LIMIT :scan",
    Path.LEASED: "SELECT seq FROM {schema}.jobs WHERE status = 'leased' AND seq {cmp} :after"
    " ORDER BY seq {dir} LIMIT :scan",
    # jobs_waits (seq) WHERE waits > 0: the jobs with edges not met, the waiting ones among them.
    Path.WAITING: "SELECT seq FROM {schema}.jobs WHERE waits > 0 AND status = 'waiting' AND seq {cmp} :after"
    " ORDER BY seq {dir} LIMIT :scan",
    # jobs_task (task, seq) WHERE task IS NOT NULL: one task's jobs, as the range of that index between two row
    # values (not ``task = …``: the planner would drop the task from the order, and walk the primary key instead,
    # filtering, wherever the task looked common; a task whose jobs all lie far back then read the whole table).
    Path.TASK: "SELECT task, seq FROM {schema}.jobs WHERE task IS NOT NULL AND (task, seq) {cmp} (:task, :after)"
    " AND (task, seq) {back} (:task, :edge) ORDER BY task {dir}, seq {dir} LIMIT :scan",
    Path.ERROR: "SELECT DISTINCT job_seq AS seq FROM {schema}.errors WHERE type = :error_type AND job_seq {cmp} :after"
    " ORDER BY job_seq {dir} LIMIT :scan",
    Path.IDS: "SELECT seq FROM {schema}.jobs WHERE id = ANY(:ids::text[]) AND seq {cmp} :after"
    " ORDER BY seq {dir} LIMIT :scan",
    # jobs_waiting (queue, available_at, seq), or with a priority jobs_ranked (queue, priority DESC, available_at,
    # seq): a row comparison pages either.
    Path.DUE: "SELECT seq, available_at FROM {schema}.jobs WHERE status = 'pending' AND queue = :queue {priority}"
    " AND (available_at, seq) > (:due_at, :after) AND available_at >= :since AND available_at < :until"
    " ORDER BY available_at, seq LIMIT :scan",
}
_FAR = 2**62
_NAME = re.compile(r"(?<![:\w]):([a-z_]+)")


def numbered(statement: str, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """``statement`` with its ``:name`` parameters turned into asyncpg's ``$n``, and their values in order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _NAME.sub(number, statement), [values[name] for name in order]


def walk(plan: SearchPlan, schema: str) -> str:
    """The walk of ``plan``'s path (its ``:scan`` rows), as a statement."""
    newest = plan.order is Order.NEWEST
    priority = "AND priority = :priority" if plan.query.priority is not None else ""
    return _WALKS[plan.path].format(
        schema=schema, cmp="<" if newest else ">", back=">" if newest else "<", dir="DESC" if newest else "ASC",
        priority=priority,
    )  # fmt: skip


def unserved(plan: SearchPlan, schema: str) -> str:
    """The filters ``plan``'s path does not serve, as a condition on the job ``j``."""
    terms = []
    if plan.statuses is not None and "status" not in plan.served:
        assert all(status in STATUSES for status in plan.statuses)  # checked values, spliced as literals
        terms.append("j.status IN (" + ", ".join(f"'{status}'" for status in plan.statuses) + ")")
    for name, term in (
        ("queue", "j.queue = :queue"),
        ("task", "j.task = :task"),
        ("priority", "j.priority = :priority"),
        ("reason", "j.reason = :reason"),
        ("since_ms", "j.available_at >= :since"),
        ("until_ms", "j.available_at < :until"),
        ("error_type", f"EXISTS (SELECT 1 FROM {schema}.errors e WHERE e.type = :error_type AND e.job_seq = j.seq)"),
        ("body", "(j.body::jsonb #> :body_path::text[])::text = :body_value"),
    ):
        if name in plan.checked:
            terms.append(term)
    return " AND ".join(terms) or "TRUE"


def parameters(plan: SearchPlan, after: Position | None, scan: int, page: int) -> dict[str, Any]:
    """Every parameter a walk and its page may name."""
    query, newest = plan.query, plan.order is Order.NEWEST
    start = (-1, -1) if plan.path is Path.DUE else (_FAR if newest else 0,)
    where = start if after is None else after
    params: dict[str, Any] = {"after": where[-1], "due_at": where[0], "scan": scan, "page": page}
    params["edge"] = -1 if newest else _FAR  # the other end of a task's range
    params |= {"queue": query.queue, "task": query.task, "priority": query.priority, "reason": query.reason}
    params |= {"error_type": query.error_type, "ids": list(query.ids)}
    params |= {"since": query.since_ms or 0, "until": _FAR if query.until_ms is None else query.until_ms}
    body = query.body
    params |= {"body_path": None, "body_value": None}
    if body is not None:
        params |= {"body_path": [str(key) for key in body.path], "body_value": body.value_json(ascii_only=False)}
    return params


def page_statement(plan: SearchPlan, schema: str) -> str:
    """A page's statement: the walk, each row's job by its key (the unserved filters checked), up to ``:page``."""
    way = "DESC" if plan.order is Order.NEWEST else ""
    # The walk's own order, which the outer query keeps without sorting (a task's: its index's columns, both).
    order = {Path.DUE: "s.available_at, s.seq", Path.TASK: f"s.task {way}, s.seq {way}"}.get(plan.path, f"s.seq {way}")
    return (
        f"SELECT {_COLUMNS.format(schema=schema)} FROM ({walk(plan, schema)}) s CROSS JOIN LATERAL"
        f" (SELECT j.* FROM {schema}.jobs j WHERE j.seq = s.seq AND {unserved(plan, schema)} LIMIT 1) j"
        f" ORDER BY {order} LIMIT :page"
    )


async def search(
    conn: Connection, schema: str, plan: SearchPlan, after: Position | None, page: int, scan: int, body: bool = True
) -> JobPage:
    """One page of ``plan`` past ``after``, in the caller's transaction (see the module's docstring)."""
    if plan.empty:
        return JobPage([], 0, False, None, plan)
    scanned = walk(plan, schema)
    params = parameters(plan, after, scan, page + 1)
    jobs = [Job.from_row(tuple(row)) for row in await conn.fetch(*_args(page_statement(plan, schema), params))]
    more = len(jobs) > page
    jobs = jobs[:page]
    errors = await _last_errors(conn, schema, [job.seq for job in jobs]) if jobs else {}
    jobs = [_shown(job, errors.get(job.seq), body) for job in jobs]
    if more:
        return JobPage(jobs, None, False, encode_cursor(position_of(jobs[-1], plan)), plan)
    count, last = await _reach(conn, plan, scanned, params)
    capped = count >= scan
    return JobPage(jobs, count, capped, encode_cursor(last) if capped else None, plan)


def _args(statement: str, params: dict[str, Any]) -> list[Any]:
    text, values = numbered(statement, params)
    return [text, *values]


async def _reach(conn: Connection, plan: SearchPlan, scanned: str, params: dict[str, Any]) -> tuple[int, Position]:
    """How many rows the walk yielded, and the last of them."""
    count = int(await conn.fetchval(*_args(f"SELECT count(*) FROM ({scanned}) s", params)))
    if not count:
        return 0, ()
    if plan.path is Path.DUE:
        last = f"SELECT available_at, seq FROM ({scanned}) s ORDER BY 1 DESC, 2 DESC LIMIT 1"
    else:
        last = f"SELECT {'min' if plan.order is Order.NEWEST else 'max'}(seq) FROM ({scanned}) s"
    row = await conn.fetchrow(*_args(last, params))
    assert row is not None
    return count, tuple(int(part) for part in row)


async def _last_errors(conn: Connection, schema: str, seqs: list[int]) -> dict[int, AttemptError]:
    rows = await conn.fetch(LAST_ERRORS.format(schema=schema), seqs)
    return {row[0]: AttemptError(*row[1:]) for row in rows}


def _shown(job: Job, error: AttemptError | None, body: bool) -> Job:
    job = job if body else replace(job, body=None)
    return job if error is None else replace(job, errors=(error,))

"""The console's job search on SQLite: each path of ``core.search`` as one bounded walk of its index, and the page
read from what it yielded (the filters the path does not serve checked on those rows only).

A page is one read snapshot: the walk (``scanned``: at most ``:scan`` rows of the path's index, in its order,
past the cursor) is the outer loop of a ``CROSS JOIN`` (SQLite keeps that order and stops at the page's
``LIMIT``), each row's job is fetched by its rowid, and the unserved filters are checked on it. Only a short page
asks how far the walk went (count of the walk, its last row), to say whether the cap was reached.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from typing import Any

from asyncq.core.jobs import Job
from asyncq.core.lifecycle import STATUSES
from asyncq.core.search import JobPage, Order, Path, Position, SearchPlan, encode_cursor, position_of
from asyncq.store.sqlite.admin import JOB_COLUMNS, JOB_EXTRAS, last_errors, snapshot
from asyncq.store.sqlite.schema import PRODUCT

_JOBS, _ERRORS = PRODUCT.jobs, PRODUCT.errors
_COLUMNS = ", ".join(f"j.{column}" for column in JOB_COLUMNS.split(", ")) + ", " + JOB_EXTRAS

# A queue's pending jobs of ``{priority}`` (a condition on it) due after the page's last, within the time range.
_DUE = (
    "SELECT seq, available_at FROM {{jobs}} WHERE status = 'pending' AND queue = :queue AND priority {priority}"
    " AND (available_at, seq) > (:due_at, :after) AND available_at >= :since AND available_at < :until"
)

# Each path's walk: ``{cmp}``/``{dir}`` the order's, ``:after`` the cursor's seq. The WHERE of a partial index is
# repeated word for word (SQLite takes a partial index only then); ``INDEXED BY`` keeps the planner from walking
# the primary key instead (``seq > :after`` looks cheaper to it).
_WALKS = {
    Path.SEQ: "SELECT seq FROM {jobs} WHERE seq {cmp} :after ORDER BY seq {dir} LIMIT :scan",
    Path.DEAD: "SELECT seq FROM {jobs} INDEXED BY {jobs}_dead WHERE status = 'dead' AND seq {cmp} :after"
    " ORDER BY seq {dir} LIMIT :scan",
    Path.LEASED: "SELECT seq FROM {jobs} INDEXED BY {jobs}_leased WHERE status = 'leased' AND seq {cmp} :after"
    " ORDER BY seq {dir} LIMIT :scan",
    # The jobs with edges not met (graph_schema's index on ``waits``, its WHERE repeated): that index is in ``waits``
    # order, so a page sorts those jobs (O(jobs with edges not met), never the table).
    Path.WAITING: "SELECT seq FROM {jobs} INDEXED BY {jobs}_waits WHERE waits > 0 AND status = 'waiting'"
    " AND seq {cmp} :after ORDER BY seq {dir} LIMIT :scan",
    # One task's jobs, from the index an enqueue fills from a task's body: (task, seq), in its order.
    Path.TASK: "SELECT seq FROM {jobs} INDEXED BY {jobs}_task WHERE task = :task AND task IS NOT NULL"
    " AND seq {cmp} :after ORDER BY seq {dir} LIMIT :scan",
    Path.ERROR: "SELECT DISTINCT job_seq AS seq FROM {errors} INDEXED BY {errors}_type"
    " WHERE type = :error_type AND job_seq {cmp} :after ORDER BY job_seq {dir} LIMIT :scan",
    Path.IDS: "SELECT seq FROM {jobs} WHERE id IN (SELECT value FROM json_each(:ids)) AND seq {cmp} :after"
    " ORDER BY seq {dir} LIMIT :scan",
    # One queue's pending jobs by when they are due, of one priority: the ranked index (queue, priority DESC,
    # available_at) with its rowid last; a row value pages it. Of any priority: ``_DUE_ANY``.
    Path.DUE: _DUE.format(priority="= :priority") + " ORDER BY available_at, seq LIMIT :scan",
}
# Of any priority, two ranges in that order merged (``schema.PENDING_BY_TIME``: the default priority's in the ranked
# index, the others' in ``asyncq_jobs_prioritised`` (queue, available_at)), each stopping at ``:scan``.
_DUE_ANY = (
    "SELECT seq, available_at FROM ("
    + " UNION ALL ".join(
        f"SELECT * FROM ({_DUE.format(priority=priority)} ORDER BY available_at, seq LIMIT :scan)"
        for priority in ("= 0", "<> 0")
    )
    + ") ORDER BY available_at, seq LIMIT :scan"
)
_FAR = 2**62


def walk(plan: SearchPlan) -> str:
    """The walk of ``plan``'s path (its ``:scan`` rows), as a statement."""
    newest = plan.order is Order.NEWEST
    walk = _DUE_ANY if plan.path is Path.DUE and plan.query.priority is None else _WALKS[plan.path]
    return walk.format(jobs=_JOBS, errors=_ERRORS, cmp="<" if newest else ">", dir="DESC" if newest else "ASC")


def unserved(plan: SearchPlan) -> str:
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
        ("error_type", f"EXISTS (SELECT 1 FROM {_ERRORS} e WHERE e.type = :error_type AND e.job_seq = j.seq)"),
        ("body", "j.body -> :body_path = :body_value"),
    ):
        if name in plan.checked:
            terms.append(term)
    return " AND ".join(terms) or "1"


def parameters(plan: SearchPlan, after: Position | None, scan: int, page: int) -> dict[str, Any]:
    """Every parameter a walk and its page may name."""
    query, newest = plan.query, plan.order is Order.NEWEST
    start = (-1, -1) if plan.path is Path.DUE else (_FAR if newest else 0,)
    where = start if after is None else after
    params: dict[str, Any] = {"after": where[-1], "due_at": where[0], "scan": scan, "page": page}
    params |= {"queue": query.queue, "task": query.task, "priority": query.priority, "reason": query.reason}
    params |= {"error_type": query.error_type, "ids": json.dumps(list(query.ids))}
    params |= {"since": query.since_ms or 0, "until": _FAR if query.until_ms is None else query.until_ms}
    body = query.body
    params |= {"body_path": None, "body_value": None}
    if body is not None:
        params |= {"body_path": "$" + "".join(f"[{key}]" if isinstance(key, int) else f'."{key}"' for key in body.path)}
        params["body_value"] = body.value_json()
    return params


def page_statement(plan: SearchPlan) -> str:
    """A page's statement: the walk, each row's job by its rowid, the unserved filters, up to ``:page`` jobs."""
    joined = f"({walk(plan)}) s CROSS JOIN {_JOBS} j ON j.seq = s.seq"
    return f"SELECT {_COLUMNS} FROM {joined} WHERE {unserved(plan)} LIMIT :page"


def search(
    con: sqlite3.Connection, plan: SearchPlan, after: Position | None, page: int, scan: int, *, body: bool = True
) -> JobPage:
    """One page of ``plan`` past ``after``, in one read snapshot (see the module's docstring)."""
    with snapshot(con):
        return search_in_transaction(con, plan, after, page, scan, body=body)


def search_in_transaction(
    con: sqlite3.Connection, plan: SearchPlan, after: Position | None, page: int, scan: int, *, body: bool = True
) -> JobPage:
    """``search`` inside the caller's transaction (an action finds its set again in its own)."""
    if plan.empty:
        return JobPage([], 0, False, None, plan)
    scanned = walk(plan)
    params = parameters(plan, after, scan, page + 1)
    jobs = [Job.from_row(tuple(row)) for row in con.execute(page_statement(plan), params)]
    more = len(jobs) > page
    jobs = jobs[:page]
    errors = last_errors(con, [job.seq for job in jobs]) if jobs else {}
    jobs = [_shown(job, errors.get(job.seq), body) for job in jobs]
    if more:
        return JobPage(jobs, None, False, encode_cursor(position_of(jobs[-1], plan)), plan)
    count, last = _reach(con, plan, scanned, params)
    capped = count >= scan
    return JobPage(jobs, count, capped, encode_cursor(last) if capped else None, plan)


def _reach(con: sqlite3.Connection, plan: SearchPlan, scanned: str, params: dict[str, Any]) -> tuple[int, Position]:
    """How many rows the walk yielded, and the last of them."""
    count = int(con.execute(f"SELECT count(*) FROM ({scanned})", params).fetchone()[0])
    if not count:
        return 0, ()
    if plan.path is Path.DUE:
        row = con.execute(f"SELECT available_at, seq FROM ({scanned}) ORDER BY 1 DESC, 2 DESC LIMIT 1", params)
    else:
        pick = "min" if plan.order is Order.NEWEST else "max"
        row = con.execute(f"SELECT {pick}(seq) FROM ({scanned})", params)
    return count, tuple(int(part) for part in row.fetchone())


def _shown(job: Job, error: Any, body: bool) -> Job:
    job = job if body else replace(job, body=None)
    return job if error is None else replace(job, errors=(error,))

"""The lifecycle engine: each transition as one short write transaction on a ``sqlite3.Connection``.

The lease lab shim calls these on the spec's tables; the async facade calls the same functions on its
own tables from its connection's thread. Every function assumes its arguments are already validated.
``*_in_transaction`` steps run inside a transaction the caller opened (``Queue.transaction()``, or an
app's own ``sqlite3`` transaction); the others open and close their own ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from functools import cache
from operator import itemgetter
from typing import Any

from asyncq.core.claim_plan import Rank, claim_rank, next_claim, plan_claim
from asyncq.core.finish_plan import (
    FinishChange,
    FinishPlan,
    FinishRow,
    RowNow,
    decide_each,
    kept,
    landed_before,
    plan_held,
    rows_to_read,
    statuses_after,
    unlanded,
)
from asyncq.core.jobs import Claimed, Enqueued, Finish, NewJob
from asyncq.core.lifecycle import DEAD, REASON_CANCELLED, CancelState, Fence, JobState, Renewal, decide_cancel
from asyncq.core.settling import all_held_once
from asyncq.errors import Conflict, StoreError, UniqueConflict
from asyncq.store.sqlite.connection import Hook, call_hook, write_transaction
from asyncq.store.sqlite.schema import Layout
from asyncq.store.sqlite.statements import (
    FINISH_ROWS_MAX,
    IN_LIST_MAX,
    INSERT_ROWS_MAX,
    activate_rows,
    finish_params,
    finish_rows,
    insert_rows,
    padded,
    rows_now,
    select_by_ids,
    select_key_holders,
    sql,
)


def enqueue_in_transaction(con: sqlite3.Connection, layout: Layout, job: NewJob) -> Enqueued:
    """Insert ``job``; ``False`` if the id exists with the same payload (the row is kept whole),
    ``Conflict`` if it exists with another payload; the holder's id if an active job holds its unique key."""
    return enqueue_rows_in_transaction(con, layout, [job])[0]


def enqueue_rows_in_transaction(con: sqlite3.Connection, layout: Layout, jobs: Sequence[NewJob]) -> list[Enqueued]:
    """``enqueue_in_transaction`` for each of ``jobs``, in order: one statement per ``INSERT_ROWS_MAX`` jobs,
    then one read of the ids that were known. A batch naming one id twice goes job by job, so that the second
    is compared with the first. On ``Conflict`` the caller's transaction holds a partial batch: roll it back."""
    if len({job.id for job in jobs}) != len(jobs):
        return [added for job in jobs for added in enqueue_rows_in_transaction(con, layout, [job])]
    inserted: set[str] = set()
    for start in range(0, len(jobs), INSERT_ROWS_MAX):
        part = jobs[start : start + INSERT_ROWS_MAX]
        chunk = padded(list(part))
        cursor = con.execute(insert_rows(layout, len(chunk)), _insert_values(layout, chunk))
        if cursor.rowcount == len(part):  # none was known: every id is new
            inserted.update(job.id for job in part)
        elif cursor.rowcount > 0:  # some were: the rows inserted now have the greatest seqs up to the last one
            now = {"last": cursor.lastrowid, "inserted": cursor.rowcount}
            inserted.update(job_id for (job_id,) in con.execute(sql(layout, "SELECT_INSERTED"), now))
    if len(inserted) == len(jobs):
        return [True] * len(jobs)
    known = [job for job in jobs if job.id not in inserted]
    found = read_states(con, layout, [job.id for job in known])
    for job in known:
        if job.id in found and found[job.id][1] != job.payload:
            raise Conflict(f"job {job.id!r} already exists with a different payload")
    held = _key_holders(con, layout, [job for job in known if job.id not in found])
    return [True if job.id in inserted else held.get(job.id, False) for job in jobs]


def _key_holders(con: sqlite3.Connection, layout: Layout, jobs: Sequence[NewJob]) -> dict[str, str]:
    """For each job not inserted although its id was new, the id of the active job that holds its unique key
    (another job, or one inserted before it in the same batch); ``UniqueConflict`` for one that asked to raise."""
    if not jobs:
        return {}
    pairs = list(dict.fromkeys((job.payload["queue"], job.payload["unique_key"]) for job in jobs))
    holders: dict[tuple[str, str], str] = {}
    for start in range(0, len(pairs), IN_LIST_MAX):
        chunk = padded(pairs[start : start + IN_LIST_MAX])
        for queue, key, job_id in con.execute(select_key_holders(layout, len(chunk)), [v for p in chunk for v in p]):
            holders[(queue, key)] = job_id
    found: dict[str, str] = {}
    for job in jobs:
        queue, key = job.payload["queue"], job.payload["unique_key"]
        holder = holders.get((queue, key))
        if holder is None:  # not inserted, yet nothing holds its id or its key: a store this code does not know
            raise StoreError(f"job {job.id!r} was not inserted and no job holds its id or unique key")
        if job.raise_on_unique:
            raise UniqueConflict(key, queue, holder, job.id)
        found[job.id] = holder
    return found


def _insert_values(layout: Layout, jobs: Sequence[NewJob]) -> list[Any]:
    """The parameters of ``INSERT_ROWS`` for ``jobs``, row after row (1.5 → 0.5 µs a job against a nested
    comprehension: the payload is read with one getter, the list extended once per job)."""
    payload_of = _payload_getter(layout)
    values: list[Any] = []
    extend = values.extend
    for job in jobs:
        extend((job.id, *payload_of(job.payload), job.max_attempts, job.available_at, job.deadline))
    return values


@cache
def _payload_getter(layout: Layout) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A function giving a payload dict's values in ``layout.stored``'s column order, always as a tuple."""
    if len(layout.stored) == 1:
        (column,) = layout.stored
        return lambda payload: (payload[column],)
    return itemgetter(*layout.stored)


def enqueue(con: sqlite3.Connection, layout: Layout, jobs: Sequence[NewJob]) -> list[Enqueued]:
    """Insert ``jobs`` in one write transaction (all or nothing); what each did (``core.jobs.Enqueued``)."""
    with write_transaction(con):
        return enqueue_rows_in_transaction(con, layout, jobs)


def claim(
    con: sqlite3.Connection,
    layout: Layout,
    owner: str,
    now_ms: int,
    lease_ms: int,
    *,
    limit: int = 1,
    scope: dict[str, Any] | None = None,
    fault: Hook = None,
) -> list[Claimed]:
    """Sweep unclaimable rows to dead, then lease up to ``limit`` ready jobs, oldest ``seq`` first.

    The sweep commits even when nothing is claimed; hooks run only when a job was claimed."""
    with write_transaction(con):
        rows = claim_rows_in_transaction(con, layout, owner, now_ms, lease_ms, limit=limit, scope=scope)
        claimed = [_claimed(layout, row) for row in rows]
        if claimed:
            call_hook(fault, "after-claim")
    if claimed:
        call_hook(fault, "after-commit")
    return claimed


def claim_rows_in_transaction(
    con: sqlite3.Connection,
    layout: Layout,
    owner: str,
    now_ms: int,
    lease_ms: int,
    *,
    limit: int = 1,
    scope: dict[str, Any] | None = None,
    count: bool = True,
    sweep: bool = True,
) -> list[tuple[Any, ...]]:
    """The sweep and the claim, inside a transaction the caller holds: the claimed rows as the layout's claim
    statement returns them (``seq, id, payload…, owner, token, attempts, lease_until, deadline, max_attempts``,
    then the product's rank columns), in the claim order (the lab's: ``seq``; the product's: ``claim_rank``).
    ``count=False`` claims ahead: the attempt is counted when a handler starts the job;
    ``sweep=False`` skips the sweep, already run in this transaction (the sweeps cover every queue)."""
    params = {"now": now_ms, "owner": owner, "lease_ms": lease_ms, "limit": limit, "count": int(count)}
    params |= scope or {}
    if sweep:
        _sweep(con, layout, now_ms)
    rows = con.execute(sql(layout, layout.claim), params).fetchall()
    return sorted(rows) if layout.settings is None else sorted(rows, key=_ranked(layout))


@cache
def _ranked(layout: Layout) -> Callable[[tuple[Any, ...]], Rank]:
    """The sort key of the product's claimed rows: ``claim_rank`` of their priority, ``available_at``, ``seq`` and
    ``late`` (the two rank columns CLAIM_RANKED returns last)."""
    at = 2 + layout.payload.index("priority")
    return lambda row: claim_rank(row[at], row[-2], row[0], bool(row[-1]))


def _claimed(layout: Layout, row: tuple[Any, ...]) -> Claimed:
    width = len(layout.payload)
    owner, token, attempts, lease_until, deadline, _max_attempts = row[2 + width : 8 + width]
    return Claimed(
        id=row[1],
        payload=dict(zip(layout.payload, row[2 : 2 + width], strict=True)),
        fence=Fence(owner=owner, token=token, attempt=attempts, lease_until=lease_until),
        deadline=deadline,
    )


def read_state(con: sqlite3.Connection, layout: Layout, job_id: str) -> tuple[int, dict[str, Any], JobState] | None:
    """``(seq, payload, lifecycle state)`` of one job, or ``None`` if it does not exist."""
    return read_states(con, layout, [job_id]).get(job_id)


def read_states(
    con: sqlite3.Connection, layout: Layout, job_ids: Sequence[str]
) -> dict[str, tuple[int, dict[str, Any], JobState]]:
    """``read_state`` for many jobs with one statement per 64 ids (missing ids are absent from the result).

    One statement for a batch instead of one per job: a group commit finishing 50 jobs spends 1.4 µs a job
    reading them instead of 5.6 (docs/benchmarks.md)."""
    unique = list(dict.fromkeys(job_ids))
    stored = layout.stored
    width = len(stored)
    found: dict[str, tuple[int, dict[str, Any], JobState]] = {}
    for start in range(0, len(unique), IN_LIST_MAX):
        chunk: list[str] = padded(unique[start : start + IN_LIST_MAX])
        for row in con.execute(select_by_ids(layout, len(chunk)), chunk):
            status, attempts, max_attempts, token, owner, lease_until, deadline, _reason = row[2 + width :]
            state = JobState(status, attempts, max_attempts, token, owner, lease_until, deadline)
            found[row[1]] = (row[0], dict(zip(stored, row[2 : 2 + width], strict=True)), state)
    return found


def finish(
    con: sqlite3.Connection,
    layout: Layout,
    items: Sequence[Finish],
    now_ms: int,
    *,
    expect: dict[str, Any] | None = None,
    fault: Hook = None,
) -> list[str | None]:
    """Apply each ticket's outcome in one write transaction, each fenced on its own.

    Returns the new status per ticket, ``None`` for a stale one (its row is left unchanged). ``expect``
    maps a job id to payload values the ticket claims (the lab's ``qty``): a mismatch is stale too."""
    with write_transaction(con):
        results = finish_in_transaction(con, layout, items, now_ms, expect=expect, fault=fault)
    if any(result is not None for result in results):
        call_hook(fault, "after-commit")
    return results


def finish_in_transaction(
    con: sqlite3.Connection,
    layout: Layout,
    items: Sequence[Finish],
    now_ms: int,
    *,
    expect: dict[str, Any] | None = None,
    fault: Hook = None,
    resend: bool = False,
) -> list[str | None]:
    """The finishes, inside a transaction the caller holds (``after-finish`` runs after each change).

    Items without ``held`` are decided on their rows, read first (one statement for the batch); items with
    it, on the claim's snapshot: the same decision while the fence holds, and the compare-and-set refuses
    it as stale otherwise. Skipping the read saves a pool's group commit about a third of a finish."""
    if fault is None and expect is None and all_held_once(items):
        return _finish_held(con, layout, items, now_ms, resend)
    on_rows = expect or {}
    reads = rows_to_read(items, on_rows)
    states = read_states(con, layout, reads) if reads else {}
    found = {  # a row whose payload differs from the ticket's (the lab's ``expect``) is missing to its ticket
        job_id: (seq, state)
        for job_id, (seq, payload, state) in states.items()
        if all(payload[k] == v for k, v in on_rows.get(job_id, {}).items())
    }
    decided = decide_each(items, found, now_ms, on_rows)
    return [_finish_one(con, layout, item, each, now_ms, fault) for item, each in zip(items, decided, strict=True)]


def _finish_held(
    con: sqlite3.Connection, layout: Layout, items: Sequence[Finish], now_ms: int, resend: bool = False
) -> list[str | None]:
    """``finish_in_transaction`` for items that all carry ``held``, one job each: the plan's decisions
    (``core.finish_plan``), then one compare-and-set statement per change and ``FINISH_ROWS_MAX`` rows, instead
    of one per row."""
    plan = plan_held(items, now_ms)
    landed: set[int] = set()
    for change, rows in plan.items():
        for start in range(0, len(rows), FINISH_ROWS_MAX):
            chunk = [row for _, row in rows[start : start + FINISH_ROWS_MAX]]
            landed.update(seq for (seq,) in con.execute(finish_rows(layout, len(chunk)), finish_params(change, chunk)))
    found = statuses_after(plan, landed, len(items))
    _keep(con, layout, items, plan, found, now_ms)
    missed = unlanded(plan, landed) if resend else []
    if missed:  # the same finishes sent again: those whose first commit did land are landed, not stale
        found = statuses_after(plan, landed_before(plan, landed, _rows_now(con, layout, missed)), len(items))
    return found


def _rows_now(con: sqlite3.Connection, layout: Layout, seqs: Sequence[int]) -> dict[int, RowNow]:
    found: dict[int, RowNow] = {}
    for begin in range(0, len(seqs), IN_LIST_MAX):
        chunk = padded(list(seqs[begin : begin + IN_LIST_MAX]))
        found.update((row[0], RowNow(*row)) for row in con.execute(rows_now(layout, len(chunk)), chunk))
    return found


def _keep(
    con: sqlite3.Connection,
    layout: Layout,
    items: Sequence[Finish],
    plan: FinishPlan,
    found: Sequence[str | None],
    now_ms: int,
) -> None:
    """Keep the errors and results of the landed finishes (``kept``'s), where the layout keeps them."""
    errors, results = kept(items, plan, found)
    if errors and layout.errors is not None:
        con.executemany(sql(layout, "KEEP_ERROR"), [(seq, attempt, now_ms, *error) for seq, attempt, error in errors])
    if results and layout.results is not None:
        rows = [(seq, result.json, now_ms, now_ms + result.keep_ms) for seq, result in results]
        con.executemany(sql(layout, "KEEP_RESULT"), rows)


def _finish_one(
    con: sqlite3.Connection,
    layout: Layout,
    item: Finish,
    decided: tuple[FinishChange, FinishRow] | None,
    now_ms: int,
    fault: Hook,
) -> str | None:
    """One finish, decided before the batch (``decide_each``) and written on its own (the lab's path: its fault
    point follows each change); a stale one (``None``) writes nothing."""
    if decided is None:
        return None
    change, row = decided
    if not con.execute(finish_rows(layout, 1), finish_params(change, [row])).fetchall():
        return None
    _keep(con, layout, [item], {change: [(0, row)]}, [change.status], now_ms)
    call_hook(fault, "after-finish")
    return change.status


def extend(
    con: sqlite3.Connection, layout: Layout, leases: Sequence[tuple[str, Fence]], now_ms: int, lease_ms: int
) -> list[Renewal | None]:
    """Renew held leases to ``min(now + lease_ms, deadline)`` in one transaction, each with whether a cancel of
    its job was requested; ``None`` for each lease that is no longer held (expired, re-claimed or finished)."""
    renewed: list[Renewal | None] = []
    with write_transaction(con):
        for job_id, fence in leases:
            params = {"id": job_id, "now": now_ms, "lease_ms": lease_ms, "owner": fence.owner}
            params |= {"token": fence.token, "attempt": fence.attempt, "lease_until": fence.lease_until}
            row = con.execute(sql(layout, "EXTEND"), params).fetchone()
            if row is None:
                renewed.append(None)
            else:
                renewed.append(Renewal(Fence(fence.owner, fence.token, fence.attempt, row[0]), bool(row[1])))
    return renewed


def release(
    con: sqlite3.Connection,
    layout: Layout,
    leases: Sequence[tuple[str, Fence]],
    now_ms: int,
    counted: Sequence[bool] | None = None,
) -> list[bool]:
    """Give back held leases of jobs never started: ``pending`` again, the attempt returned (where the claim
    counted one: ``counted``, all by default); ``False`` for a lease no longer held (nothing changes for it)."""
    released: list[bool] = []
    refunds = [True] * len(leases) if counted is None else counted
    with write_transaction(con):
        for (job_id, fence), refund in zip(leases, refunds, strict=True):
            params = {"id": job_id, "now": now_ms, "owner": fence.owner, "token": fence.token}
            params |= {"attempt": fence.attempt, "lease_until": fence.lease_until, "refund": int(refund)}
            released.append(con.execute(sql(layout, "RELEASE"), params).rowcount == 1)
    return released


def redrive(
    con: sqlite3.Connection,
    layout: Layout,
    job_id: str,
    now_ms: int,
    deadline: int,
    note: str,
    *,
    fault: Hook = None,
) -> bool:
    """Re-arm a dead job with a fresh budget, writing the audit row first; ``ValueError`` if the job is
    missing or not dead (nothing changes)."""
    with write_transaction(con):
        found = read_state(con, layout, job_id)
        if found is None or found[2].status != DEAD:
            raise ValueError(f"job {job_id!r} is {'missing' if found is None else 'not dead'}")
        seq, payload, state = found
        _check_key_free(con, layout, job_id, payload)
        audit = {"id": job_id, "token": state.token, "now": now_ms, "note": note, "seq": seq}
        con.execute(sql(layout, "AUDIT"), audit)
        call_hook(fault, "after-audit")
        con.execute(sql(layout, "REDRIVE"), {"seq": seq, "now": now_ms, "deadline": deadline})
        call_hook(fault, "after-redrive")
    call_hook(fault, "after-commit")
    return True


def _check_key_free(con: sqlite3.Connection, layout: Layout, job_id: str, payload: dict[str, Any]) -> None:
    """A dead job's redrive makes it active again: ``UniqueConflict`` (before any change) if another active job
    of its queue holds its unique key now."""
    key = payload.get("unique_key")
    if key is None:
        return
    rows = con.execute(select_key_holders(layout, 1), (payload["queue"], key)).fetchall()
    if rows:
        raise UniqueConflict(key, payload["queue"], rows[0][2], job_id)


def cancel(
    con: sqlite3.Connection, layout: Layout, job_id: str, now_ms: int, note: str
) -> tuple[CancelState, bool, str]:
    """Cancel a job as ``core.lifecycle.decide_cancel`` decides on its row: end it dead (``cancelled``), or store
    a request for its holder, each audited in the same transaction; ``too_late`` changes nothing. With whether an
    audit row was written (a request made again writes none) and its status before; ``ValueError`` if the job is
    missing."""
    with write_transaction(con):
        found = read_state(con, layout, job_id)
        if found is None:
            raise ValueError(f"job {job_id!r} is missing")
        seq, _payload, state = found
        decided = decide_cancel(state, now_ms)
        if decided is CancelState.TOO_LATE:
            return decided, False, state.status
        params = {"seq": seq, "now": now_ms}
        statement = "CANCEL" if decided is CancelState.CANCELLED else "REQUEST_CANCEL"
        if con.execute(sql(layout, statement), params).rowcount == 0:
            return decided, False, state.status  # a request stored already
        action = "cancel" if decided is CancelState.CANCELLED else "cancel_request"
        audit = {"id": job_id, "token": state.token, "now": now_ms, "note": note, "action": action, "seq": seq}
        con.execute(sql(layout, "AUDIT_ACTION"), audit | {"reason": REASON_CANCELLED})
    return decided, True, state.status


def settle_and_claim_in_transaction(
    con: sqlite3.Connection,
    layout: Layout,
    items: Sequence[Finish],
    now_ms: int,
    owner: str,
    lease_ms: int,
    wants: Sequence[tuple[dict[str, Any], int]],
    total: int | None = None,
    start_now: int | None = None,
    started: Sequence[tuple[int, str, Fence]] = (),
    resend: bool = False,
) -> tuple[list[str | None], list[tuple[Any, ...]], int, list[bool]]:
    """A worker pool's group commit, inside a transaction the caller holds: count the attempts of the jobs
    claimed ahead that a handler has ``started`` (``(seq, id, fence)``; one bool each: still held), finish
    ``items``, and claim up to ``limit`` jobs for each ``(scope, limit)`` in ``wants`` (at most ``total`` over
    all of them). The first ``start_now`` claimed jobs (all, if ``None``) count an attempt at once: they start
    now; the rest are claimed ahead. Returns the statuses, the claimed rows (counted ones first), how many of
    them were counted, and the activations. The claims are ``core.claim_plan``'s."""
    activated = _activate(con, layout, started) if started else []
    found = finish_in_transaction(con, layout, items, now_ms, resend=resend)
    plan = plan_claim([limit for _scope, limit in wants], total, start_now)
    if plan.sweep:
        _sweep(con, layout, now_ms)
    claimed: list[tuple[Any, ...]] = []
    counted = 0
    dry: set[int] = set()  # queues found with no ready job left
    claim = next_claim(plan, 0, 0)
    while claim is not None:
        rows = claim_rows_in_transaction(
            con,
            layout,
            owner,
            now_ms,
            lease_ms,
            limit=claim.limit,
            scope=wants[claim.queue][0],
            count=claim.counts,
            sweep=False,
        )
        claimed += rows
        counted += len(rows) if claim.counts else 0
        if len(rows) < claim.limit:
            dry.add(claim.queue)
        claim = next_claim(plan, claim.step + 1, len(claimed), dry)
    return found, claimed, counted, activated


def _sweep(con: sqlite3.Connection, layout: Layout, now_ms: int) -> None:
    """Park every unclaimable row (deadline passed, attempts used up, a cancel requested) as dead, in every queue:
    once a claim."""
    con.execute(sql(layout, "SWEEP_DEADLINE"), {"now": now_ms})
    con.execute(sql(layout, "SWEEP_EXHAUSTED"), {"now": now_ms})
    if layout.cancels:
        con.execute(sql(layout, "SWEEP_CANCELLED"), {"now": now_ms})


def _activate(con: sqlite3.Connection, layout: Layout, started: Sequence[tuple[int, str, Fence]]) -> list[bool]:
    """Count the attempt of each started job claimed ahead, fenced on its lease; ``True`` where it landed."""
    landed: set[int] = set()
    for begin in range(0, len(started), IN_LIST_MAX):
        chunk = [
            (seq, job_id, f.token, f.owner, f.attempt, f.lease_until)
            for seq, job_id, f in started[begin : begin + IN_LIST_MAX]
        ]
        values = [value for row in padded(chunk) for value in row]
        landed.update(seq for (seq,) in con.execute(activate_rows(layout, len(chunk)), values))
    return [seq in landed for seq, _id, _fence in started]

"""The lifecycle engine: each transition as one short write transaction on a ``sqlite3.Connection``.

The lease lab shim calls these on the spec's tables; the async facade calls the same functions on its
own tables from its connection's thread. Every function assumes its arguments are already validated.
``*_in_transaction`` steps run inside a transaction the caller opened (``Queue.transaction()``, or an
app's own ``sqlite3`` transaction); the others open and close their own ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from functools import cache, partial
from operator import itemgetter
from typing import Any

from asyncq.core.claim_plan import plan_claim
from asyncq.core.dependencies import Ripple
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
from asyncq.core.flow_limits import Hold
from asyncq.core.jobs import Claimed, Enqueued, Finish, NewJob, Ticket
from asyncq.core.lifecycle import DEAD, DONE, REASON_CANCELLED, CancelState, Fence, JobState, Renewal, decide_cancel
from asyncq.core.offers import Offer
from asyncq.core.settling import all_held_once
from asyncq.errors import Conflict, StoreError, UniqueConflict
from asyncq.store.sqlite import graphs
from asyncq.store.sqlite.claiming import claim_planned, claim_rows_in_transaction, sweep_unclaimable
from asyncq.store.sqlite.connection import Hook, call_hook, write_transaction
from asyncq.store.sqlite.graphs import End
from asyncq.store.sqlite.offers import NOTE_OFFERED, claim_for_offers, insert_leased, offer_now, settle_offer
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


_LINKED = itemgetter(NewJob._fields.index("linked"))
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def enqueue_rows_in_transaction(con: sqlite3.Connection, layout: Layout, jobs: Sequence[NewJob]) -> list[Enqueued]:
    """``enqueue_in_transaction`` for each of ``jobs``, in order: one statement per ``INSERT_ROWS_MAX`` jobs,
    then one read of the ids that were known. A batch naming one id twice goes job by job, so that the second
    is compared with the first. On ``Conflict`` the caller's transaction holds a partial batch: roll it back. A batch
    with dependencies or a group also stores its edges and counts (``graphs.enqueue_linked``). An idle pool's offer
    takes a job enqueued alone at its insert (``offers.offer_now``), a batch's ready jobs by a claim after it
    (``offers.claim_for_offers``)."""
    if layout.offers and len(jobs) == 1:  # one job: inserted leased to an idle pool's offer, if one takes it
        offer = offer_now(con, jobs[0])
        if offer is not None and _insert_for_offer(con, layout, jobs[0], *offer):
            return [True]
    if layout.graphs and any(map(_LINKED, jobs)):
        added = graphs.enqueue_linked(con, jobs, partial(_insert_rows, con, layout))
    else:
        added = _insert_rows(con, layout, jobs)
    if len(jobs) > 1:
        claim_for_offers(con, layout, jobs, added)
    return added


def _insert_for_offer(con: sqlite3.Connection, layout: Layout, job: NewJob, owner: str, lease_ms: int) -> bool:
    """Insert ``job`` leased to the offer of ``owner`` at once (no pending entry added and removed, no count
    changed: a leased job is not counted) and note it as offered; ``False`` if its id or unique key was taken (the
    plain insert then says which)."""
    columns = _columns_set(layout, [job])
    values = [*_insert_values([job], columns), owner, min(job.enqueued_at + lease_ms, job.deadline)]
    cursor = con.execute(insert_leased(layout, columns), values)
    if cursor.rowcount == 0:
        return False
    con.execute(NOTE_OFFERED, (owner, cursor.lastrowid))
    return True


def _insert_rows(con: sqlite3.Connection, layout: Layout, jobs: Sequence[NewJob]) -> list[Enqueued]:
    if len(jobs) > 1 and len({job.id for job in jobs}) != len(jobs):
        return [added for job in jobs for added in _insert_rows(con, layout, [job])]
    inserted: set[str] = set()
    for start in range(0, len(jobs), INSERT_ROWS_MAX):
        part = jobs[start : start + INSERT_ROWS_MAX]
        chunk = padded(list(part)) if len(part) > 1 else part  # one job: nothing to pad
        columns = _columns_set(layout, chunk)
        cursor = con.execute(insert_rows(layout, len(chunk), columns), _insert_values(chunk, columns))
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
        if job.id in found and _differs(found[job.id][1], job.payload):
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


def _columns_set(layout: Layout, jobs: Sequence[NewJob]) -> tuple[str, ...]:
    """The payload columns an insert of ``jobs`` writes: ``layout.inserted`` but those of ``layout.defaults`` that
    every one of ``jobs`` leaves at its default (one compare a job for the common job that sets none of them)."""
    if not layout.defaults:
        return layout.inserted
    names, defaults = _defaults(layout)
    odd = [values for values in map(_getter(names), [job.payload for job in jobs]) if values != defaults]
    if not odd:
        return _kept(layout, frozenset())
    return _kept(
        layout,
        frozenset(
            name
            for name, default, seen in zip(names, defaults, zip(*odd, strict=True), strict=True)
            if {*seen} != {default}
        ),
    )


@cache
def _defaults(layout: Layout) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """``layout.defaults`` as its names and its values."""
    return tuple(name for name, _ in layout.defaults), tuple(default for _, default in layout.defaults)


@cache
def _kept(layout: Layout, written: frozenset[str]) -> tuple[str, ...]:
    """``layout.inserted`` without the columns of ``layout.defaults`` not in ``written``, in its order."""
    left = {name for name, _default in layout.defaults} - written
    return tuple(column for column in layout.inserted if column not in left)


def _insert_values(jobs: Sequence[NewJob], columns: tuple[str, ...]) -> list[Any]:
    """The parameters of ``INSERT_ROWS`` for ``jobs`` and the payload's ``columns``, row after row (1.5 → 0.5 µs a job
    against a nested comprehension: the payload is read with one getter, the list extended once per job)."""
    payload_of = _getter(columns)
    values: list[Any] = []
    extend = values.extend
    for job in jobs:
        extend((job.id, *payload_of(job.payload), job.max_attempts, job.available_at, job.deadline))
    return values


def _differs(stored: dict[str, Any], payload: dict[str, Any]) -> bool:
    """Whether a new job's payload differs from a stored row's compared columns (``Layout.stored``: a derived
    column is not compared)."""
    return any(payload[column] != value for column, value in stored.items())


@cache
def _getter(columns: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A function giving a payload dict's values of ``columns``, in their order, always as a tuple."""
    if len(columns) == 1:
        (column,) = columns
        return lambda payload: (payload[column],)
    return itemgetter(*columns)


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
    ripple: Ripple | None = None,
) -> list[str | None]:
    """Apply each ticket's outcome in one write transaction, each fenced on its own.

    Returns the new status per ticket, ``None`` for a stale one (its row is left unchanged). ``expect``
    maps a job id to payload values the ticket claims (the lab's ``qty``): a mismatch is stale too."""
    with write_transaction(con):
        results = finish_in_transaction(con, layout, items, now_ms, expect=expect, fault=fault, ripple=ripple)
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
    ripple: Ripple | None = None,
) -> list[str | None]:
    """The finishes, inside a transaction the caller holds (``after-finish`` runs after each change). A job in a
    graph that ends has its dependants and group settled in the same transaction (``ripple`` counts what that
    released).

    Items without ``held`` are decided on their rows, read first (one statement for the batch); items with
    it, on the claim's snapshot: the same decision while the fence holds, and the compare-and-set refuses
    it as stale otherwise. Skipping the read saves a pool's group commit about a third of a finish."""
    ripple = Ripple() if ripple is None else ripple
    if fault is None and expect is None and all_held_once(items):
        return _finish_held(con, layout, items, now_ms, ripple, resend)
    on_rows = expect or {}
    reads = rows_to_read(items, on_rows)
    states = read_states(con, layout, reads) if reads else {}
    found = {  # a row whose payload differs from the ticket's (the lab's ``expect``) is missing to its ticket
        job_id: (seq, state)
        for job_id, (seq, payload, state) in states.items()
        if all(payload[k] == v for k, v in on_rows.get(job_id, {}).items())
    }
    decided = decide_each(items, found, now_ms, on_rows)
    return [
        _finish_one(con, layout, item, each, now_ms, fault, ripple) for item, each in zip(items, decided, strict=True)
    ]


def _finish_held(
    con: sqlite3.Connection, layout: Layout, items: Sequence[Finish], now_ms: int, ripple: Ripple, resend: bool = False
) -> list[str | None]:
    """``finish_in_transaction`` for items that all carry ``held``, one job each: the plan's decisions
    (``core.finish_plan``), then one compare-and-set statement per change and ``FINISH_ROWS_MAX`` rows, instead
    of one per row. The rows that landed with ``links`` (jobs in a graph) that ended are settled after."""
    plan = plan_held(items, now_ms)
    landed: set[int] = set()
    linked: list[End] = []
    for change, rows in plan.items():
        for start in range(0, len(rows), FINISH_ROWS_MAX):
            chunk = [row for _, row in rows[start : start + FINISH_ROWS_MAX]]
            written = con.execute(finish_rows(layout, len(chunk)), finish_params(change, chunk)).fetchall()
            landed.update(map(_FIRST, written))
            if any(map(_SECOND, written)) and (change.status == DONE or change.status == DEAD):  # rows in a graph
                linked += [(seq, change.status, links) for seq, links in written if links is not None]
    found = statuses_after(plan, landed, len(items))
    _keep(con, layout, items, plan, found, now_ms)
    if linked:
        graphs.settle_ends(con, linked, now_ms, ripple)
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
    ripple: Ripple,
) -> str | None:
    """One finish, decided before the batch (``decide_each``) and written on its own (the lab's path: its fault
    point follows each change); a stale one (``None``) writes nothing."""
    if decided is None:
        return None
    change, row = decided
    landed = con.execute(finish_rows(layout, 1), finish_params(change, [row])).fetchall()
    if not landed:
        return None
    _keep(con, layout, [item], {change: [(0, row)]}, [change.status], now_ms)
    links = landed[0][1]
    if links is not None and change.status in (DONE, DEAD):
        graphs.settle_ends(con, [(row.seq, change.status, links)], now_ms, ripple)
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
        redrive_in_transaction(con, layout, job_id, now_ms, deadline, note, fault=fault)
    call_hook(fault, "after-commit")
    return True


def redrive_in_transaction(
    con: sqlite3.Connection,
    layout: Layout,
    job_id: str,
    now_ms: int,
    deadline: int,
    note: str,
    *,
    fault: Hook = None,
) -> None:
    """``redrive``'s statements inside the caller's write transaction (a console's bulk redrive runs many)."""
    found = read_state(con, layout, job_id)
    if found is None or found[2].status != DEAD:
        raise ValueError(f"job {job_id!r} is {'missing' if found is None else 'not dead'}")
    seq, payload, state = found
    _check_key_free(con, layout, job_id, payload)
    rearm = graphs.plan_rearm(con, seq, job_id) if layout.graphs else None  # refused here: nothing written
    audit = {"id": job_id, "token": state.token, "now": now_ms, "note": note, "seq": seq}
    con.execute(sql(layout, "AUDIT"), audit)
    call_hook(fault, "after-audit")
    con.execute(sql(layout, "REDRIVE"), {"seq": seq, "now": now_ms, "deadline": deadline})
    if rearm is not None:
        graphs.rearm(con, seq, *rearm)
    call_hook(fault, "after-redrive")


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
    con: sqlite3.Connection, layout: Layout, job_id: str, now_ms: int, note: str, ripple: Ripple | None = None
) -> tuple[CancelState, bool, str]:
    """Cancel a job as ``core.lifecycle.decide_cancel`` decides on its row: end it dead (``cancelled``), or store
    a request for its holder, each audited in the same transaction; ``too_late`` changes nothing. With whether an
    audit row was written (a request made again writes none) and its status before; ``ValueError`` if the job is
    missing."""
    with write_transaction(con):
        return cancel_in_transaction(con, layout, job_id, now_ms, note, ripple)


def cancel_in_transaction(
    con: sqlite3.Connection, layout: Layout, job_id: str, now_ms: int, note: str, ripple: Ripple | None = None
) -> tuple[CancelState, bool, str]:
    """``cancel``'s statements inside the caller's write transaction (a console's bulk cancel runs many)."""
    found = read_state(con, layout, job_id)
    if found is None:
        raise ValueError(f"job {job_id!r} is missing")
    seq, _payload, state = found
    decided = decide_cancel(state, now_ms)
    if decided is CancelState.TOO_LATE:
        return decided, False, state.status
    params = {"seq": seq, "now": now_ms}
    if decided is CancelState.CANCELLED:
        (links,) = con.execute(sql(layout, "CANCEL"), params).fetchone()
        if links is not None:  # a job in a graph: its dependants and group are settled with it
            graphs.settle_ends(con, [(seq, DEAD, links)], now_ms, Ripple() if ripple is None else ripple)
    elif con.execute(sql(layout, "REQUEST_CANCEL"), params).rowcount == 0:
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
    limited: set[str] | None = None,
    ripple: Ripple | None = None,
    offer: Offer | None = None,
) -> tuple[list[str | None], list[Ticket], list[bool], tuple[Hold, ...]]:
    """A worker pool's group commit, inside a transaction the caller holds: count the attempts of the jobs
    claimed ahead that a handler has ``started`` (``(seq, id, fence)``; one bool each: still held), finish
    ``items``, and claim up to ``limit`` jobs for each ``(scope, limit)`` in ``wants`` (at most ``total`` over
    all of them). The first ``start_now`` claimed jobs (all, if ``None``) count an attempt at once: they start
    now; the rest are claimed ahead. Returns the statuses, the tickets claimed (counted ones first), the
    activations, and the queues their limits held. The claims are ``core.claim_plan``'s;
    ``limited`` is the caller's hint of the queues found limited before (kept up to date here); ``ripple`` counts the
    jobs that the ends of jobs in a graph released (they may be claimed by this same commit); ``offer`` is the pool's
    (``core.offers``): the jobs offered to it that it had not read come last, claimed ahead."""
    ripple = Ripple() if ripple is None else ripple
    activated = _activate(con, layout, started) if started else []
    found = finish_in_transaction(con, layout, items, now_ms, resend=resend, ripple=ripple)
    plan = plan_claim([limit for _scope, limit in wants], total, start_now)
    if plan.sweep:
        sweep_unclaimable(con, layout, now_ms, ripple)
    params = {"now": now_ms, "owner": owner, "lease_ms": lease_ms}
    claimed, holds = claim_planned(con, layout, plan, wants, params, set() if limited is None else limited)
    if offer is not None:
        queues = [scope["queue"] for scope, _n in wants]
        claimed += settle_offer(con, offer, owner, queues, lease_ms, now_ms, len(claimed))
    return found, claimed, activated, holds


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

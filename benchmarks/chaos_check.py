"""The chaos harness's checker: after the drain, every store read through fresh connections, one verdict.

Like Jepsen's total-queue checker, it compares what was enqueued with what the receiver holds after a full
drain. Each job's body is ``{"item": <job id>, "qty": 1}``, and the receiver's ``stock`` effect adds ``qty``
to the row of ``item``, inside the inbox row's transaction, so the effect table counts how many times each
job's effect was applied, apart from the inbox's own dedup row.

- lost: a job enqueued that the queue does not hold, or that the queue holds ``done`` while the receiver has
  no effect for it (acknowledged, never applied);
- duplicated: effect applications beyond the first (a ``stock`` row with ``qty`` > 1), summed;
- unexpected: an inbox row or an effect for no enqueued job or with another body, an inbox conflict, a job
  row with another body, an inbox row without its effect (or the reverse), or an effect no worker recorded
  starting (the start log is written before each request);
- non-terminal: jobs still ``pending`` or ``leased``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from chaos_store import Held, InboxRows, JobRow, integrity_check, read_inbox


def body_of(job_id: str) -> str:
    """The canonical JSON body of job ``job_id`` (sorted keys, compact): how queue and inbox store it."""
    return json.dumps({"item": job_id, "qty": 1}, sort_keys=True, separators=(",", ":"))


class WorkerEvents(NamedTuple):
    """What the workers' event log recorded (``chaos_worker``)."""

    starts: Counter[str]
    started: set[tuple[str, int]]  # (job id, token) of every start
    failures: Counter[str]  # failed deliveries by job id
    failure_kinds: Counter[str]  # failed deliveries by error type
    stale_finishes: int
    leases_lost: int


def read_events(path: Path) -> WorkerEvents:
    starts: Counter[str] = Counter()
    started: set[tuple[str, int]] = set()
    failures: Counter[str] = Counter()
    failure_kinds: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, *rest = line.split()
        kinds[kind] += 1
        if kind == "S":
            starts[rest[0]] += 1
            started.add((rest[0], int(rest[1])))
        elif kind == "F":
            failures[rest[0]] += 1
            failure_kinds[rest[3]] += 1
    return WorkerEvents(starts, started, failures, failure_kinds, kinds["X"], kinds["L"])


def percentile(values: Sequence[float], percent: float) -> float | None:
    """Nearest-rank percentile (``None`` for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(percent / 100 * len(ordered) + 0.5)))
    return round(ordered[rank - 1], 1)


def unexpected_at_receiver(inbox: InboxRows, expected: set[str], starts: Counter[str]) -> Counter[str]:
    """What the receiver holds that no enqueued job explains, by kind."""
    found: Counter[str] = Counter()
    event_ids = {event_id for event_id, *_ in inbox.events}
    for event_id, body, _duplicates, conflicts in inbox.events:
        found["inbox_row_unknown_id"] += event_id not in expected
        found["inbox_row_other_body"] += event_id in expected and body != body_of(event_id)
        found["inbox_conflicts"] += conflicts
    for item in inbox.effects:
        found["effect_unknown_id"] += item not in expected
        found["effect_without_inbox_row"] += item not in event_ids
        found["effect_never_started"] += starts[item] == 0
    found["inbox_row_without_effect"] = len(event_ids - set(inbox.effects))
    return +found


def job_figures(
    jobs: Iterable[JobRow],
    expected: set[str],
    inbox: InboxRows,
    events: WorkerEvents,
    uncounted: Counter[str] | None = None,
) -> dict[str, Any]:
    """Lost, non-terminal and dead figures from the queue's rows and the receiver's effects. ``uncounted``: by job,
    the starts a kill caught before the pool counted them (``uncounted_starts``)."""
    starts, failures = events.starts, events.failures
    counted = starts - (uncounted or Counter())
    rows = {job.id: job for job in jobs}
    dead = [job for job in rows.values() if job.status == "dead"]
    statuses = Counter(job.status for job in rows.values())
    return {
        "lost": len(expected - set(rows))
        + sum(1 for job in rows.values() if job.status == "done" and job.id not in inbox.effects),
        "unexpected_jobs": sum(1 for job in rows.values() if job.id not in expected or job.body != body_of(job.id)),
        "non_terminal": statuses["pending"] + statuses["leased"],
        "done": statuses["done"],
        "dead": len(dead),
        "dead_by_reason": dict(sorted(Counter(str(job.reason) for job in dead).items())),
        "dead_never_started": sum(1 for job in dead if starts[job.id] == 0),
        "dead_every_attempt_started": sum(1 for job in dead if starts[job.id] >= job.attempts),
        "dead_every_attempt_failed": sum(1 for job in dead if failures[job.id] >= job.attempts),
        "dead_but_applied": sum(1 for job in dead if job.id in inbox.effects),
        "dead_without_counted_start": sum(1 for job in dead if counted[job.id] == 0),
        # An attempt is counted at claim (or, claimed ahead, at the commit after its start): those no counted start
        # explains were spent by kills (or lost leases).
        "attempts_without_start": sum(max(0, job.attempts - counted[job.id]) for job in rows.values()),
    }


def caught_before_start(held_at_kills: Iterable[tuple[str, Held]], started: set[tuple[str, int]]) -> int:
    """Leases a kill found with an attempt counted and no start under their token. A pool counts the attempt of
    a job it claims for a free slot in the claim's commit (a job claimed ahead, for its buffer, only once a
    handler starts it), so a kill between that commit and the handler's first step spends the attempt. With one
    attempt a job (no lease is taken again once counted) these are exactly the attempts spent without a start
    that the design allows; any other is a bug."""
    return len(caught_leases(held_at_kills, started))


def uncounted_starts(held_at_kills: Iterable[tuple[str, Held]], started: set[tuple[str, int]]) -> Counter[str]:
    """By job, the leases a kill found started under their token with no attempt counted yet (0): a job claimed
    ahead is counted in the commit after its handler starts, and the kill came first, so the start spent nothing
    and the job was claimed again. Exact for first attempts, hence for a one-attempt run."""
    return Counter(
        job_id for job_id, (token, attempts) in held_at_kills if attempts == 0 and (job_id, token) in started
    )


def caught_leases(held_at_kills: Iterable[tuple[str, Held]], started: set[tuple[str, int]]) -> list[tuple[str, int]]:
    """``(job id, token)`` of each lease ``caught_before_start`` counts."""
    return [
        (job_id, token)
        for job_id, (token, attempts) in held_at_kills
        if attempts > 0 and (job_id, token) not in started
    ]


def caught_detail(
    caught: Iterable[tuple[str, int]], jobs: Iterable[JobRow], started: set[tuple[str, int]]
) -> list[str]:
    """One line a caught lease: its job's final row and the tokens it started under (a failure's evidence)."""
    rows = {job.id: job for job in jobs}
    tokens: dict[str, list[int]] = {}
    for job_id, token in sorted(started):
        tokens.setdefault(job_id, []).append(token)
    return [
        f"{job_id} token {token}: {rows[job_id].status}/{rows[job_id].reason} attempts {rows[job_id].attempts},"
        f" started under {tokens.get(job_id, [])}"
        for job_id, token in caught
        if job_id in rows
    ]


def check(
    store: Any, inbox_path: Path, events_path: Path, expected: set[str], held_at_kills: Iterable[tuple[str, Held]] = ()
) -> dict[str, Any]:
    """The checker's figures about the stores (the nemesis adds its own; ``held_at_kills`` is each lease a
    killed worker held, as the kill left it)."""
    events = read_events(events_path)
    inbox = read_inbox(inbox_path)
    jobs = list(store.jobs())
    held_at_kills = list(held_at_kills)
    uncounted = uncounted_starts(held_at_kills, events.started)
    figures = job_figures(jobs, expected, inbox, events, uncounted)
    caught = caught_leases(held_at_kills, events.started)
    unexpected = unexpected_at_receiver(inbox, expected, events.starts)
    if figures["unexpected_jobs"]:
        unexpected["job_row_unknown_or_other_body"] = figures["unexpected_jobs"]
    return {
        "lost": figures["lost"],
        "duplicated": sum(qty - 1 for qty in inbox.effects.values() if qty > 1),
        "unexpected": sum(unexpected.values()),
        "unexpected_by_kind": dict(unexpected),
        "non_terminal": figures["non_terminal"],
        "done": figures["done"],
        "dead": figures["dead"],
        "dead_by_reason": figures["dead_by_reason"],
        "dead_never_started": figures["dead_never_started"],
        "dead_without_counted_start": figures["dead_without_counted_start"],
        "uncounted_starts": sum(uncounted.values()),
        "dead_every_attempt_started": figures["dead_every_attempt_started"],
        "dead_every_attempt_failed": figures["dead_every_attempt_failed"],
        "dead_but_applied": figures["dead_but_applied"],
        "attempts_without_start": figures["attempts_without_start"],
        "counted_leases_killed_before_start": len(caught),
        "caught_leases": caught_detail(caught, jobs, events.started),
        "redeliveries": sum(count - 1 for count in events.starts.values() if count > 1),
        "failed_deliveries": dict(events.failure_kinds.most_common()),
        "duplicates_absorbed": sum(duplicates for _id, _body, duplicates, _conflicts in inbox.events),
        "stale_finishes_rejected": events.stale_finishes,
        "leases_lost": events.leases_lost,
        "integrity": {"queue": store.integrity(), "inbox": integrity_check(inbox_path)},
    }


def failed(report: dict[str, Any]) -> list[str]:
    """The figures that make the run fail (the exit code is non-zero when any is listed)."""
    bad = [name for name in ("lost", "duplicated", "unexpected", "non_terminal") if report[name]]
    return bad + [f"integrity.{name}" for name, verdict in report["integrity"].items() if verdict != "ok"]

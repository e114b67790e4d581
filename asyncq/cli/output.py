"""How the ``asyncq`` command shows its results to a person: aligned columns, times in ISO-8601 UTC with
their age (``3m12s ago``), and a progress line on a terminal. ``--json`` prints the same data as it is;
each ``render_*`` function here turns one command's data into text, and adds nothing to it."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from asyncq.cli.records import one_line_error
from asyncq.core.retention import RETENTION_STATES

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def iso(ms: int | None) -> str:
    """A millisecond timestamp as ISO-8601 UTC to the second (``-`` for none)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def span(ms: int) -> str:
    """A duration in its two largest units: ``3m12s``, ``2h05m``, ``4d03h``; under a second in ms."""
    ms = abs(ms)
    if ms < 1000:
        return f"{ms}ms"
    parts: list[str] = []
    for unit, size in _UNITS:
        if ms >= size or parts:
            parts.append(f"{ms // size}{unit}" if not parts else f"{ms // size:02d}{unit}")
            ms %= size
        if len(parts) == 2:
            break
    return "".join(parts)


def moment(ms: int | None, now_ms: int) -> str:
    """``2025-01-02T03:04:05Z (3m12s ago)``, or ``(in 12s)`` for a time to come."""
    if ms is None:
        return "-"
    relation = f"{span(now_ms - ms)} ago" if ms <= now_ms else f"in {span(ms - now_ms)}"
    return f"{iso(ms)} ({relation})"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned with two spaces between them; a column of numbers is right-aligned."""
    cells = [[("-" if value is None else str(value)) for value in row] for row in rows]
    numeric = [all(isinstance(row[i], int) for row in rows) and bool(rows) for i in range(len(headers))]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def counts(mapping: dict[str, int]) -> str:
    """``done 5, dead 2`` (``none`` when empty)."""
    return ", ".join(f"{key} {value}" for key, value in mapping.items()) or "none"


def emit(data: dict[str, Any], text: str, as_json: bool, stream: TextIO | None = None) -> None:
    """Print the command's data: as one JSON document, or as the text a person reads."""
    out = stream or sys.stdout
    out.write((json.dumps(data, indent=2, sort_keys=True) if as_json else text) + "\n")
    out.flush()


# -- one renderer per command ---------------------------------------------------------------------------


INIT_VERBS = {
    "created": "created queue {path}",
    "added": "added the queue tables to {path} (its other tables are as they were)",
    "migrated": "migrated queue {path} from schema version {previous_schema_version}",
    "checked": "checked queue {path} (already current: nothing changed)",
}


def render_init(data: dict[str, Any]) -> str:
    done = f"{INIT_VERBS[data['action']].format(**data)}: schema version {data['schema_version']}, "
    if data.get("store") == "postgresql":
        return done + f"PostgreSQL schema {data['schema']}, synchronous_commit on"
    return done + f"journal {data['journal_mode']}, auto_vacuum {data['auto_vacuum']}"


def render_enqueue(data: dict[str, Any]) -> str:
    text = (
        f"enqueued {data['added']} new job(s) into {data['path']}; "
        f"{data['unchanged']} already there with the same body (unchanged)"
    )
    held = data.get("held_by", {})
    if held:
        text += f"; {len(held)} not added, their unique key held by an active job: " + ", ".join(
            f"{job_id} (held by {holder})" for job_id, holder in held.items()
        )
    return text


def render_status(data: dict[str, Any]) -> str:
    now = data["now_ms"]
    statuses = table(["status", "jobs"], [*data["by_status"].items(), ("total", data["total"])])
    lines = [f"queue file  {data['path']}", f"now         {iso(now)}", "", statuses, ""]
    lines.append(f"dead by reason: {counts(data['dead_by_reason'])}")
    age = data["oldest_pending_age_ms"]
    lines.append(f"oldest ready pending job: {'none' if age is None else span(age) + ' waiting'}")
    histogram = [(row["attempts"], row["jobs"]) for row in data["attempts"]]
    lines += ["", "attempts made by pending and leased jobs:", table(["attempts", "jobs"], histogram)]
    leases = [(row["owner"], row["held"], moment(row["first_expiry_ms"], now)) for row in data["leases"]]
    lines += ["", "leases held:", table(["owner", "held", "first expiry"], leases) if leases else "none"]
    lines.append(f"expired leases (their worker stopped renewing; the next claim takes them): {data['expired_leases']}")
    lines += ["", queue_settings_text(data["queues"], now), retention_rules_text(data["retention"])]
    lines += [limits_text(data["limits"], now)]
    inbox = data["inbox"]
    if inbox is not None:
        totals = f"applied {inbox['applied']}, duplicates {inbox['duplicates']}, conflicts {inbox['conflicts']}"
        lines += ["", f"inbox {inbox['file']}: {totals}"]
    return "\n".join(lines)


def compact(body: object) -> str:
    """A body as one line of JSON (non-ASCII kept as it is)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def job_rows(jobs: Sequence[dict[str, Any]], now_ms: int) -> str:
    """A list of jobs as a table; a ``body`` (``--body``) or ``last_error`` (``dead``) column when the records
    carry one, last, since they are the widest."""
    headers = ["seq", "id", "queue", "prio", "status", "reason", "attempts", "redrives", "available", "deadline"]
    headers.append("owner")
    keyed = any(job.get("unique_key") is not None for job in jobs)  # a column only when some job has a unique key
    if keyed:
        headers.append("unique key")
    extra = [key for key in ("last_error", "body") if jobs and key in jobs[0]]
    headers += [key.replace("_", " ") for key in extra]
    rows = [
        (
            job["seq"],
            job["id"],
            job["queue"],
            job["priority"],
            job["status"],
            job["reason"],
            f"{job['attempts']}/{job['max_attempts']}",
            job["redrives"],
            moment(job["available_at"], now_ms),
            moment(job["deadline"], now_ms),
            job["owner"],
            *([job.get("unique_key")] if keyed else []),
            *(one_line_error(job[key]) if key == "last_error" else compact(job[key]) for key in extra),
        )
        for job in jobs
    ]
    return table(headers, rows)


def _more(data: dict[str, Any]) -> str:
    if not data["more"]:
        return f"{data['count']} job(s)"
    last = data["jobs"][-1]["seq"]
    return f"{data['count']} job(s) shown; there are more (--limit, or --after {last})"


def render_jobs(data: dict[str, Any]) -> str:
    if not data["jobs"]:
        return "no jobs match"
    return job_rows(data["jobs"], data["now_ms"]) + "\n" + _more(data)


def render_dead(data: dict[str, Any]) -> str:
    head = f"dead jobs by reason: {counts(data['by_reason'])}"
    if not data["jobs"]:
        return head
    return head + "\n\n" + job_rows(data["jobs"], data["now_ms"]) + "\n" + _more(data)


def render_show(data: dict[str, Any]) -> str:
    job, now = data["job"], data["now_ms"]
    times = {"available_at", "deadline", "lease_until", "cancel_requested_at"}
    shown = {key: value for key, value in job.items() if key not in ("body", "errors", "result")}
    if shown.get("cancel_requested_at") is None:  # shown only for a job whose cancel was requested
        shown.pop("cancel_requested_at", None)
    width = max(len(key) for key in shown)
    lines = [
        f"{key.ljust(width)}  {moment(value, now) if key in times else '-' if value is None else value}"
        for key, value in shown.items()
    ]
    lines += ["body:", json.dumps(job["body"], indent=2, sort_keys=True, ensure_ascii=False), ""]
    if "result" in job:
        lines += ["result:", json.dumps(job["result"], indent=2, sort_keys=True, ensure_ascii=False), ""]
    lines += [*render_errors(job["errors"], now), ""]
    history = [(h["seq"], h["action"], h["token"], moment(h["at_ms"], now), h["note"]) for h in data["history"]]
    lines.append(table(["audit", "action", "token", "at", "note"], history) if history else "no redrive or cancel")
    return "\n".join(lines)


def render_errors(errors: Sequence[dict[str, Any]], now_ms: int) -> list[str]:
    """Each failed attempt's error, oldest first: when, type and message, and the traceback indented."""
    if not errors:
        return ["no errors recorded"]
    lines = [f"errors of {len(errors)} failed attempt(s):"]
    for error in errors:
        lines.append(
            f"attempt {error['attempt']} at {moment(error['at_ms'], now_ms)}: {error['type']}: {error['message']}"
        )
        lines += [f"    {line}" for line in error["traceback"].rstrip("\n").splitlines()]
    return lines


def render_redrive(data: dict[str, Any]) -> str:
    if not data["jobs"]:
        return "no dead job matches: nothing to redrive"
    rows = [(job["id"], job["queue"], job["reason"], job["token"], data["note"]) for job in data["jobs"]]
    listing = table(["id", "queue", "reason", "token", "note"], rows)
    if not data["applied"]:
        return f"would redrive {data['count']} job(s) (nothing written; add --apply):\n{listing}"
    audit = [(a["seq"], a["id"], a["token"], iso(a["at_ms"]), a["note"]) for a in data["audit"]]
    lines = [
        f"redrove {len(data['audit'])} job(s); audit rows written:",
        table(["audit", "id", "token", "at", "note"], audit),
    ]
    lines += [f"skipped {s['id']}: {s['error']}" for s in data["skipped"]]
    return "\n".join(lines)


_CANCEL_STATES = {
    "cancelled": "now dead, reason cancelled",
    "requested": "it is running: its worker stops it at its next lease renewal, then it is dead, reason cancelled",
    "too_late": "it had ended already: nothing changed",
}


def queue_settings_text(queues: Sequence[dict[str, Any]], now_ms: int) -> str:
    """The queues' stored settings: which are paused (since, by whom, why), and their ``max_wait``."""
    paused = [q for q in queues if q["paused"]]
    if not paused:
        lines = ["paused queues: none"]
    else:
        rows = [(q["queue"], moment(q["paused_at"], now_ms), q["paused_by"], q["note"]) for q in paused]
        lines = ["paused queues (no worker claims from them):", table(["queue", "since", "by", "note"], rows)]
    waits = [f"{q['queue']} {span(q['max_wait_ms'])}" for q in queues if q["max_wait_ms"] is not None]
    lines.append(f"max_wait: {', '.join(waits) if waits else 'none (strict priorities)'}")
    return "\n".join(lines)


def retention_rules_text(rules: Sequence[dict[str, Any]]) -> str:
    """The retention rules, the default first: what each scope keeps, per state."""
    if not rules:
        return "retention: no rules (every job is kept)"
    rows = [(_scope(rule), *(_window(rule[f"retain_{state}_ms"]) for state in RETENTION_STATES)) for rule in rules]
    wider = "" if any(rule["queue"] is None for rule in rules) else " (queues without a rule keep every job)"
    header = f"retention rules (a job follows its task's in its queue, else its queue's, else the default){wider}:"
    return "\n".join([header, table(["scope", *RETENTION_STATES], rows)])


def _scope(rule: dict[str, Any]) -> str:
    if rule["queue"] is None:
        return "every queue (the default)"
    return f"queue {rule['queue']}" if rule["task"] is None else f"task {rule['task']} in queue {rule['queue']}"


def _window(ms: int | None) -> str:
    return "forever" if ms is None else span(ms) if ms else "0s"


def render_retention(data: dict[str, Any]) -> str:
    """The rules (a plain listing), or the rule set or cleared (and its audit row), then what a ``--run`` removed."""
    if data["rules"] is not None:
        return retention_rules_text(data["rules"])
    lines = []
    audit = data["audit"]
    if audit is not None:
        scope = _scope({"queue": None if data["default"] else data["queue"], "task": data["task"]})
        windows = ", ".join(f"{state} {_window(audit[f'retain_{state}_ms'])}" for state in RETENTION_STATES)
        done = "cleared the rule" if audit["action"] == "retention_clear" else f"set retention {windows}"
        lines.append(f"{done} of {scope} (by {audit['actor']}); audit row {audit['seq']}")
    run = data["run"]
    if run is not None:
        shown = (
            ", ".join(
                f"{row['queue']}{' task ' + row['task'] if row['task'] else ''} {row['state']} {row['jobs']}"
                for row in run["removed"]
            )
            or "nothing"
        )
        lines.append(f"removed {run['total']} job(s) past their retention in {run['batches']} batch(es): {shown}")
    return "\n".join(lines)


def limits_text(limits: Sequence[dict[str, Any]], now_ms: int) -> str:
    """The limits in force and what they hold now: the live leases against the queue's concurrency, the keys at
    their limit, the rate and when it lets the next job start."""
    if not limits:
        return "limits: none"
    rows = [
        (
            each["queue"],
            each["slots_used"] if each["concurrency"] is None else f"{each['slots_used']}/{each['concurrency']}",
            None if each["per_key_concurrency"] is None else _per_key(each),
            None if each["rate"] is None else _rate(each),
            None if each["rate_next_ms"] is None else _next(each["rate_next_ms"], now_ms),
        )
        for each in limits
    ]
    heading = "limits (leases live now, counted across every process and host):"
    return "\n".join([heading, table(["queue", "running", "per key", "rate", "next start"], rows)])


def _per_key(limit: dict[str, Any]) -> str:
    return f"{limit['per_key_concurrency']} a key ({limit['keys_full']} of {limit['keys_busy']} busy keys full)"


def _rate(limit: dict[str, Any]) -> str:
    burst = "" if limit["burst"] == 1 else f", burst {limit['burst']}"
    return f"{limit['rate']} per {span(limit['per_ms'])}{burst}"


def _next(ms: int, now_ms: int) -> str:
    return "now" if ms <= now_ms else f"in {span(ms - now_ms)}"


def render_limits(data: dict[str, Any]) -> str:
    """The limits set (and their audit row), then the limits in force with what they hold now."""
    lines = []
    audit = data["audit"]
    if audit is not None:
        lines.append(f"set limits on queue {data['queue']} (by {audit['actor']}); audit row {audit['seq']}")
    if data["queue"] is not None and not data["limits"]:
        lines.append(f"queue {data['queue']}: no limits")
    else:
        lines.append(limits_text(data["limits"], data["now_ms"]))
    return "\n".join(lines)


def render_queue_move(data: dict[str, Any]) -> str:
    audit = data["audit"]
    wait = audit["max_wait_ms"]
    done = {"pause": "paused", "resume": "resumed", "retention": "set retention on", "limits": "set limits on"}.get(
        audit["action"]
    )
    if done is None:
        done = f"set max_wait {'none' if wait is None else span(wait)} on"
    return f"{done} queue {data['queue']} (by {audit['actor']}); audit row {audit['seq']} note {audit['note']}"


def render_cancel(data: dict[str, Any]) -> str:
    """The outcome's state first (``cancelled``, ``requested``, ``too_late``), then what it means."""
    audit = data["audit"]
    written = f"; audit row {audit['seq']} note {audit['note']}" if audit is not None else ""
    return f"{data['state']}: {data['id']} is {data['status']} ({_CANCEL_STATES[data['state']]}){written}"


def render_prune(data: dict[str, Any]) -> str:
    cutoff = f"ended before {iso(data['cutoff_ms'])} ({span(data['older_than_ms'])} ago)"
    found = f"{data['count']} job(s) {cutoff}: {counts(data['by_status'])}"
    ids = ", ".join(data["ids"]) + (" …" if len(data["ids"]) < data["count"] else "")
    if not data["applied"]:
        return f"would delete {found} (nothing written; add --apply)" + (f"\nfirst: {ids}" if ids else "")
    vacuum = {
        "incremental": "space given back (incremental vacuum)",
        "full": "file rewritten by VACUUM (auto_vacuum is now incremental)",
        "skipped": "space kept for new jobs: this file is not auto_vacuum=incremental (see --vacuum)",
        "autovacuum": f"deleted in {data.get('batches')} batch(es); autovacuum frees the space for new jobs",
    }[data["vacuum"]]
    where = "table" if data["vacuum"] == "autovacuum" else "file"
    return (
        f"deleted {data['deleted']} of {found}; audit rows kept\n{vacuum}; "
        f"{where} {data['bytes_before']} -> {data['bytes_after']} bytes"
    )


def render_backup(data: dict[str, Any]) -> str:
    return (
        f"backed up {data['source']} to {data['path']}: {data['bytes']} bytes, {data['pages']} pages of "
        f"{data['page_size']}, integrity {data['check']}, jobs {counts(data['jobs'])}"
    )


def render_work(data: dict[str, Any]) -> str:
    return (
        f"worker {data['owner']} on {', '.join(data['queues'])}: claimed {data['claimed']}, "
        f"finished {counts(data['finished'])}, stale finishes {data['stale_finishes']}, leases lost "
        f"{data['leases_lost']}, handler errors {data['handler_errors']}, internal errors "
        f"{data.get('internal_errors', 0)}, store busy {data.get('store_busy', 0)}, in {data['seconds']:.1f}s"
    )


class ProgressBar:
    """A one-line bar redrawn in place (for a terminal): ``[#####-----]  500/1000 jobs``."""

    def __init__(self, total: int, stream: TextIO, width: int = 30) -> None:
        self.total, self.stream, self.width = max(total, 1), stream, width

    def show(self, done: int) -> None:
        filled = self.width * done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} jobs")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()

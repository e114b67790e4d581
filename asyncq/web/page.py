"""The dashboard's HTML: one self-contained page (inline CSS, an inline SVG chart, no CDN), every value
escaped with ``html.escape``. Pure functions from the snapshot the dashboard read to text."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape

from asyncq.core.dependencies import WaitsFor
from asyncq.core.flow import QueueAuditEntry, QueueSettings
from asyncq.core.flow_limits import LimitUsage
from asyncq.core.groups import Group
from asyncq.core.jobs import AttemptError, AuditEntry, Job
from asyncq.core.retention import FOREVER, RETENTION_STATES, RetentionRule, rule_for
from asyncq.core.schedules import Schedule, ScheduleEvent, timing_text
from asyncq.core.stats import Stats

CHART_STATUSES = {"pending": "#1f6feb", "leased": "#d29922", "dead": "#cf222e"}  # done only grows: not charted
WIDTH, HEIGHT, LEFT, BOTTOM = 640, 180, 48, 22

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1f2328;background:#fff}
h1{font-size:1.3rem;margin:0 0 .2rem}h2{font-size:1.05rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;margin:.2rem 0}th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left}
th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#656d76}code{font-size:12px}svg{border:1px solid #d0d7de;background:#fbfbfb}
form{display:flex;gap:.3rem;margin:0}input{font:inherit;width:9rem}button{font:inherit;cursor:pointer}
.legend span{margin-right:1rem}.swatch{display:inline-block;width:.8rem;height:.8rem;margin-right:.25rem}
"""

# Reload every few seconds, unless the operator is typing (a note or the token would be lost).
REFRESH_SCRIPT = """
(function(){var every=%d;function typing(){var a=document.activeElement;
return (a&&a.tagName==="INPUT")||Array.prototype.some.call(document.querySelectorAll("input"),
function(i){return i.type!=="hidden"&&i.value!==""})}
function tick(){if(typing()){setTimeout(tick,1000)}else{location.replace(location.pathname)}}
setTimeout(tick,every)})();
"""


@dataclass(frozen=True)
class Sample:
    """Queue depth at one moment, for the chart."""

    at_ms: int
    counts: dict[str, int]


@dataclass(frozen=True)
class Snapshot:
    """Everything one page shows, read in one go."""

    stats: Stats
    dead_jobs: list[Job]
    audit: list[AuditEntry]
    leases: list[Job]
    samples: list[Sample] = field(default_factory=list)
    #: Every queue's stored settings (paused, max_wait) and the newest moves on queues.
    queues: list[QueueSettings] = field(default_factory=list)
    queue_moves: list[QueueAuditEntry] = field(default_factory=list)
    #: Every retention rule (the default, the queues', the tasks').
    retention: list[RetentionRule] = field(default_factory=list)
    #: The limits in force and what they hold now.
    limits: list[LimitUsage] = field(default_factory=list)
    #: Every schedule and the newest ticks that did not run (skipped, missed).
    schedules: list[Schedule] = field(default_factory=list)
    skipped_ticks: list[ScheduleEvent] = field(default_factory=list)
    #: The jobs waiting for dependencies with what each waits for, and the groups (``asyncq.web.graph_page``).
    waiting: list[Job] = field(default_factory=list)
    waits: dict[str, WaitsFor] = field(default_factory=dict)
    groups: list[Group] = field(default_factory=list)


def utc(ms: int | None) -> str:
    """Epoch milliseconds as ``YYYY-MM-DD HH:MM:SS.mmmZ``."""
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _cells(values: Iterable[object], numeric: Sequence[int] = ()) -> str:
    return "".join(
        f'<td class="n">{escape(str(v))}</td>' if i in numeric else f"<td>{escape(str(v))}</td>"
        for i, v in enumerate(values)
    )


def _table(table_id: str, headers: Sequence[str], rows: Sequence[str], empty: str) -> str:
    if not rows:
        return f'<p class="muted" id="{table_id}-empty">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def render_counts(stats: Stats) -> str:
    """Jobs by status, the oldest ready job's wait, expired leases and dead jobs by reason."""
    rows = [
        f'<tr><th>{escape(s)}</th><td class="n" id="count-{escape(s)}">{n}</td></tr>'
        for s, n in stats.by_status.items()
    ]
    rows.append(f'<tr><th>total</th><td class="n" id="count-total">{stats.total}</td></tr>')
    age = "none ready" if stats.oldest_ready_age_ms is None else f"{stats.oldest_ready_age_ms / 1000:.1f} s"
    rows.append(f'<tr><th>oldest ready waits</th><td class="n" id="oldest-ready">{escape(age)}</td></tr>')
    rows.append(f'<tr><th>expired leases</th><td class="n" id="expired-leases">{stats.expired_leases}</td></tr>')
    reasons = ", ".join(f"{escape(r)}: {n}" for r, n in sorted(stats.dead_by_reason.items())) or "none"
    rows.append(f'<tr><th>dead by reason</th><td id="dead-by-reason">{reasons}</td></tr>')
    return f'<table id="counts"><tbody>{"".join(rows)}</tbody></table>'


def render_chart(samples: Sequence[Sample]) -> str:
    """An inline SVG line chart of pending, leased and dead jobs over ``samples``."""
    label = f"queue depth over the last {len(samples)} samples"
    svg = f'<svg id="chart" role="img" aria-label="{label}" width="{WIDTH}" height="{HEIGHT}" '
    svg += f'viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg"><title>{label}</title>'
    if len(samples) < 2:
        return svg + f'<text x="{LEFT}" y="{HEIGHT // 2}" fill="#656d76">collecting samples…</text></svg>'
    first, last = samples[0].at_ms, samples[-1].at_ms
    top = max(1, *(sample.counts.get(status, 0) for sample in samples for status in CHART_STATUSES))
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - 8

    def point(sample: Sample, status: str) -> str:
        x = LEFT + (sample.at_ms - first) / max(1, last - first) * plot_w
        y = 8 + plot_h - sample.counts.get(status, 0) / top * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [
        f'<line x1="{LEFT}" y1="{8 + plot_h}" x2="{WIDTH - 8}" y2="{8 + plot_h}" stroke="#8c959f"/>',
        f'<line x1="{LEFT}" y1="8" x2="{LEFT}" y2="{8 + plot_h}" stroke="#8c959f"/>',
        f'<text x="{LEFT - 6}" y="16" text-anchor="end" font-size="11">{top}</text>',
        f'<text x="{LEFT - 6}" y="{8 + plot_h}" text-anchor="end" font-size="11">0</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 6}" font-size="11">{escape(utc(first))}</text>',
        f'<text x="{WIDTH - 8}" y="{HEIGHT - 6}" text-anchor="end" font-size="11">{escape(utc(last))}</text>',
    ]
    for status, colour in CHART_STATUSES.items():
        points = " ".join(point(sample, status) for sample in samples)
        parts.append(
            f'<polyline class="series-{status}" fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'
        )
    return svg + "".join(parts) + "</svg>"


def render_legend() -> str:
    """The chart's colours."""
    spans = (f'<span><i class="swatch" style="background:{c}"></i>{s}</span>' for s, c in CHART_STATUSES.items())
    return f'<p class="legend">{"".join(spans)}</p>'


def _redrive_form(job_id: str) -> str:
    return (
        '<form method="post" action="/redrive">'
        f'<input type="hidden" name="job" value="{escape(job_id)}">'
        '<input name="note" placeholder="note" required maxlength="500" aria-label="note" '
        'title="why: 1-500 printable characters">'
        '<input name="token" type="password" placeholder="token" required autocomplete="off" aria-label="token">'
        "<button>Redrive</button></form>"
    )


def _short(body: object, limit: int = 80) -> str:
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_error(error: AttemptError | None, limit: int = 120) -> str:
    """``Type: message`` of an attempt's error on one line, cut to ``limit`` characters."""
    if error is None:
        return ""
    text = " ".join(f"{error.type}: {error.message}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_dead(jobs: Sequence[Job], total: int) -> str:
    """Dead jobs with their reasons and last errors, newest first, each with a redrive form."""
    rows = []
    for job in jobs:
        attempts = f"{job.attempts}/{job.max_attempts}"
        error, body = short_error(job.last_error), _short(job.body)
        values = (job.id, job.queue, job.reason or "", attempts, job.redrives, error, body)
        rows.append(f'<tr data-job="{escape(job.id)}">{_cells(values, (3, 4))}<td>{_redrive_form(job.id)}</td></tr>')
    shown = f'<p class="muted">showing {len(jobs)} of {total}</p>' if total > len(jobs) else ""
    headers = ("job", "queue", "reason", "attempts", "redrives", "last error", "body")
    return _table("dead", (*headers, "redrive (needs the start-up token)"), rows, "no dead jobs") + shown


def render_audit(rows: Sequence[AuditEntry]) -> str:
    """The redrive and cancel audit log, newest first."""
    cells = [
        f'<tr data-seq="{row.seq}">'
        + _cells((utc(row.at_ms), row.id, row.action, row.token, row.note, row.reason or ""), (3,))
        + "</tr>"
        for row in rows
    ]
    return _table("audit", ("at", "job", "action", "token", "note", "reason"), cells, "no audit rows yet")


def _window(ms: int | None) -> str:
    """A retention window as the page shows it (``None``: kept for ever)."""
    return "forever" if ms is None else f"{ms / 1000:g} s"


def render_queues(
    queues: Sequence[QueueSettings], moves: Sequence[QueueAuditEntry], rules: Sequence[RetentionRule] = ()
) -> str:
    """The queues with stored settings (paused: since, by whom, why; max_wait; how long each ended state is kept by
    the rule that applies to the queue: its own or the default), the retention rules, then the newest moves on
    queues."""
    cells = [
        f'<tr data-queue="{escape(q.queue)}">'
        + _cells((q.queue, "paused" if q.paused else "running", utc(q.paused_at), q.paused_by or "", q.note or "",
                  "" if q.max_wait_ms is None else f"{q.max_wait_ms / 1000:g} s",
                  *(_window((rule_for(rules, q.queue, None) or FOREVER).of(state)) for state in RETENTION_STATES)))
        + "</tr>"
        for q in queues
    ]  # fmt: skip
    kept = tuple(f"{state} kept" for state in RETENTION_STATES)
    headers = ("queue", "state", "paused since", "by", "note", "max wait", *kept)
    settings = _table("queues", headers, cells, "no queue paused, given a max wait or a retention: every queue runs")
    rows = [f"<tr>{_cells((utc(m.at_ms), m.queue, m.action, m.task or '', m.actor, m.note))}</tr>" for m in moves]
    return (
        settings
        + render_retention(rules)
        + _table("queue-moves", ("at", "queue", "action", "task", "by", "note"), rows, "no moves on queues yet")
    )


def render_retention(rules: Sequence[RetentionRule]) -> str:
    """Every retention rule: its scope (every queue, a queue, a task's jobs in a queue) and each state's window."""
    cells = [
        f"<tr>{_cells((_scope(rule), *(_window(rule.windows.of(state)) for state in RETENTION_STATES)))}</tr>"
        for rule in rules
    ]
    headers = ("retention rule", *(f"{state} kept" for state in RETENTION_STATES))
    return _table("retention", headers, cells, "no retention rules: every finished job is kept")


def _scope(rule: RetentionRule) -> str:
    if rule.queue is None:
        return "every queue (default)"
    return f"queue {rule.queue}" if rule.task is None else f"task {rule.task} in queue {rule.queue}"


def render_schedules(schedules: Sequence[Schedule], skipped: Sequence[ScheduleEvent]) -> str:
    """Each schedule (when it ticks, running, paused or retired, its last tick and next run, its counters), then the
    newest ticks that did not run and why."""
    cells = []
    for s in schedules:
        state = "retired" if s.retired else f"paused by {s.paused_by}: {s.pause_note}" if s.paused else "running"
        values = (s.name, timing_text(s.definition), state, s.definition.task, s.definition.queue,
                  f"{s.definition.overlap}/{s.definition.missed}", utc(s.last_tick), utc(s.next_tick),
                  s.ticks_fired, s.ticks_skipped, s.ticks_missed)  # fmt: skip
        cells.append(f'<tr data-schedule="{escape(s.name)}">{_cells(values, (8, 9, 10))}</tr>')
    headers = ("schedule", "when", "state", "task", "queue", "overlap/missed", "last tick", "next run", "fired",
               "skipped", "missed")  # fmt: skip
    listed = _table("schedules", headers, cells, "no schedules")
    rows = [
        f"<tr>{_cells((utc(e.at_ms), e.schedule, e.kind, utc(e.tick_ms), utc(e.through_ms), e.ticks), (5,))}</tr>"
        for e in skipped
    ]
    return listed + _table("skipped-ticks", ("at", "schedule", "why", "tick", "through", "ticks"), rows,
                           "no skipped or missed ticks")  # fmt: skip


def render_limits(limits: Sequence[LimitUsage], now_ms: int) -> str:
    """The limits in force (``Queue.set_limits``) and what they hold now: the live leases against the queue's
    concurrency, the keys at their per-key limit, the rate and when it lets the next job start."""
    cells = []
    for usage in limits:
        limit = usage.limits
        running = f"{usage.slots_used}" + ("" if limit.concurrency is None else f" of {limit.concurrency}")
        per_key = "" if limit.per_key_concurrency is None else f"{limit.per_key_concurrency} a key"
        full = "" if limit.per_key_concurrency is None else f"{usage.keys_full} of {usage.keys_busy}"
        rate = "" if limit.rate is None else f"{limit.rate} per {(limit.per_ms or 0) / 1000:g} s, burst {limit.burst}"
        due = usage.rate_next_ms
        start = "" if due is None else "now" if due <= now_ms else f"in {(due - now_ms) / 1000:.1f} s"
        cells.append(
            f'<tr data-queue="{escape(usage.queue)}">{_cells((usage.queue, running, per_key, full, rate, start))}</tr>'
        )
    headers = ("queue", "running", "per key", "keys full", "rate", "next start")
    return _table("limits", headers, cells, "no limits: every queue claims as fast as its workers go")


def render_leases(jobs: Sequence[Job], now_ms: int) -> str:
    """Leases in flight, the soonest to expire first."""
    cells = []
    for job in jobs:
        until = job.lease_until or 0
        left = (until - now_ms) / 1000
        remaining = f"{left:.1f} s" if left > 0 else "expired"
        asked = job.cancel_requested_at
        cancel = "" if asked is None else f"requested {utc(asked)}"  # the holder stops it at its next renewal
        values = (job.owner or "", job.id, job.queue, job.priority, job.token, job.attempts, utc(until), remaining,
                  cancel, job.unique_key or "", job.limit_key or "")  # fmt: skip
        cells.append(f"<tr>{_cells(values, (3, 4, 5, 7))}</tr>")
    headers = ("owner", "job", "queue", "priority", "token", "attempt", "lease until", "left", "cancel", "unique key",
               "limit key")  # fmt: skip
    return _table("leases", headers, cells, "no leases in flight")


def render_page(path: str, snapshot: Snapshot, *, refresh_seconds: float, nonce: str) -> str:
    """The whole status page."""
    from asyncq.web.graph_page import render_graphs  # its sections use this module's cells and tables

    stats = snapshot.stats
    dead_total = stats.by_status.get("dead", 0)
    queues = render_queues(snapshot.queues, snapshot.queue_moves, snapshot.retention)
    body = (
        f'<h1>asyncq dashboard</h1><p class="muted"><code>{escape(path)}</code> as of '
        f'<span id="now">{escape(utc(stats.now_ms))}</span></p>'
        f"<h2>Jobs</h2>{render_counts(stats)}"
        f"<h2>Queue depth</h2>{render_chart(snapshot.samples)}{render_legend()}"
        f"<h2>Dead jobs</h2>{render_dead(snapshot.dead_jobs, dead_total)}"
        f"<h2>Redrive audit log</h2>{render_audit(snapshot.audit)}"
        f"<h2>Queues: pause, max wait and retention</h2>{queues}"
        f"<h3>Limits</h3>{render_limits(snapshot.limits, stats.now_ms)}"
        f"<h2>Schedules</h2>{render_schedules(snapshot.schedules, snapshot.skipped_ticks)}"
        f"<h2>Leases in flight</h2>{render_leases(snapshot.leases, stats.now_ms)}"
        f"{render_graphs(snapshot.waiting, snapshot.waits, snapshot.groups)}"
    )
    script = REFRESH_SCRIPT % int(refresh_seconds * 1000)
    return _document("asyncq dashboard", body, f'<script nonce="{escape(nonce)}">{script}</script>')


def render_message(title: str, message: str) -> str:
    """A short page for a refused or failed request, with a way back."""
    body = f'<h1>{escape(title)}</h1><p id="message">{escape(message)}</p><p><a href="/">back to the dashboard</a></p>'
    return _document(title, body, "")


def _document(title: str, body: str, script: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head>'
        f"<body>{body}{script}</body></html>"
    )

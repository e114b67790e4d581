"""The Overview: jobs by status now, throughput and failures and depth over a window (charts from the samples kept in
the store), and every queue: its depth, ready and leased jobs, its oldest ready job's wait, its recent rates,
whether it is paused (since, by whom, why), with pause and resume, and the retention rule that applies to it
(``core.retention.rule_for``: its own, else the default), beside the list of every retention rule, and the limits
in force with what they hold now (``Queue.limits``: slots used across every process and host, keys at their limit,
when the rate lets the next job start)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from asyncq.core.flow import QueueSettings
from asyncq.core.flow_limits import LimitUsage, limits_text
from asyncq.core.retention import RetentionRule, Windows, rule_for
from asyncq.core.samples import QueueFigures, Sample
from asyncq.web.console import charts
from asyncq.web.console.http import Response

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx


@dataclass(frozen=True)
class QueueRow:
    """One queue as the overview lists it."""

    name: str
    figures: QueueFigures | None
    settings: QueueSettings | None
    done_per_min: float | None
    failed_per_min: float | None
    spark: str
    retention: Windows | None = None  # the rule its jobs without a task rule follow (None: kept for ever)
    retention_from: str = ""  # "queue" (its own rule) or "default"; its tasks' own rules: ``task_rules``
    task_rules: int = 0

    @property
    def paused(self) -> bool:
        return self.settings is not None and self.settings.paused


async def page(ctx: Ctx) -> Response:
    return ctx.render("overview.html", **await values(ctx))


async def values(ctx: Ctx) -> dict[str, Any]:
    """Everything the overview (and its live region) shows."""
    window = ctx.request.arg("window") or "1h"
    if window not in charts.WINDOWS:
        window = "1h"
    queue = ctx.console.queue
    now = queue.now()
    start = now - charts.WINDOWS[window]
    stats = await ctx.console.totals()
    samples = await ctx.console.samples(start)
    settings = {each.queue: each for each in await queue.queue_settings()}
    rules = await queue.retention_rules()
    rows = [kept_by(row, rules) for row in queue_rows(samples, settings, start, now)]
    return {
        "window": window,
        "windows": list(charts.WINDOWS),
        "stats": stats,
        "rows": rows,
        "charts": [charts.rates(samples, start, now), charts.depth(samples, start, now)],
        "last_sample": samples[-1] if samples else None,
        "sampling": ctx.app.settings.sample_seconds,
        "rules": rules,
        "limits": [limit_row(usage) for usage in await queue.limits()],
    }


@dataclass(frozen=True)
class LimitRow:
    """One limited queue as the overview lists it."""

    queue: str
    text: str  # every limit in force, one line
    used: str  # the live leases against the concurrency (or alone)
    keys: str  # keys holding a lease, and how many are at the per-key limit ("" without one)
    rate_next_ms: int | None  # when the rate lets the next job start (None: no rate)


def limit_row(usage: LimitUsage) -> LimitRow:
    """``usage`` in the overview's words."""
    limits = usage.limits
    used = str(usage.slots_used) if limits.concurrency is None else f"{usage.slots_used} of {limits.concurrency}"
    keys = "" if limits.per_key_concurrency is None else f"{usage.keys_full} of {usage.keys_busy} busy keys full"
    return LimitRow(usage.queue, limits_text(limits), used, keys, usage.rate_next_ms)


def queue_rows(samples: list[Sample], settings: dict[str, QueueSettings], start: int, now: int) -> list[QueueRow]:
    """Each queue of the newest sample (and each with stored settings), with its rates over the newest interval."""
    latest = samples[-1] if samples else None
    previous = samples[-2] if len(samples) > 1 else None
    figures = {each.queue: each for each in latest.queues} if latest else {}
    minutes = (latest.at_ms - previous.at_ms) / 60_000 if latest and previous else None
    rows = []
    for name in sorted(set(figures) | set(settings)):
        found = figures.get(name)
        done = found.done / minutes if found and minutes else None
        failed = found.failed / minutes if found and minutes else None
        spark = charts.sparkline(samples, name, start, now)
        rows.append(QueueRow(name, found, settings.get(name), done, failed, spark))
    return rows


def kept_by(row: QueueRow, rules: list[RetentionRule]) -> QueueRow:
    """``row`` with the retention rule that applies to its queue (``rule_for``), where it comes from, and how many of
    its tasks have rules of their own."""
    own = any(rule.queue == row.name and rule.task is None for rule in rules)
    windows = rule_for(rules, row.name, None)
    source = "queue" if own else ("default" if windows is not None else "")
    tasks = sum(rule.queue == row.name and rule.task is not None for rule in rules)
    return replace(row, retention=windows, retention_from=source, task_rules=tasks)

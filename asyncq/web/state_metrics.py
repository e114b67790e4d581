"""The gauges of stored state a scrape reads besides the counts (``asyncq.web.metrics``' collector): each schedule's
tick counters, next run and pause; each limited queue's limits and what they hold."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from asyncq.core.flow_limits import LimitUsage, rate_per_second
from asyncq.core.schedules import Schedule


def schedule_families(schedules: Sequence[Schedule], now_ms: int) -> list[Metric]:
    """Each schedule's stored tick counters; each live one's next run and pause."""
    ticks = CounterMetricFamily(
        "asyncq_schedule_ticks", "A schedule's ticks by outcome (its stored counters).", labels=["schedule", "outcome"]
    )
    next_run = GaugeMetricFamily(
        "asyncq_schedule_next_run_seconds", "Seconds until a live schedule's next tick (below 0: overdue).",
        labels=["schedule"],
    )  # fmt: skip
    paused = GaugeMetricFamily("asyncq_schedule_paused", "1 while a live schedule is paused.", labels=["schedule"])
    for each in schedules:
        for outcome, count in (("fired", each.ticks_fired), ("skipped", each.ticks_skipped),
                               ("missed", each.ticks_missed)):  # fmt: skip
            ticks.add_metric([each.name, outcome], count)
        if not each.retired:
            paused.add_metric([each.name], int(each.paused))
            if each.next_tick is not None:
                next_run.add_metric([each.name], (each.next_tick - now_ms) / 1000)
    return [ticks, next_run, paused]


def limit_families(limits: Sequence[LimitUsage], now_ms: int | None) -> list[Metric]:
    """The limits in force and what they hold (``describe`` names them with none)."""
    limit = GaugeMetricFamily(
        "asyncq_queue_limit", "A queue's limits in force (absent: no such limit).", labels=["queue", "limit"]
    )
    used = GaugeMetricFamily("asyncq_queue_slots_used", "A limited queue's live leases now.", labels=["queue"])
    full = GaugeMetricFamily("asyncq_queue_limit_keys_full", "Limit keys at their per-key limit now.", labels=["queue"])
    wait = GaugeMetricFamily(
        "asyncq_queue_rate_wait_seconds", "Until the rate lets the next job start (0: room now).", labels=["queue"]
    )
    for each in limits:
        values = each.limits._asdict() | {"rate_per_second": rate_per_second(each.limits)}
        for name in ("concurrency", "per_key_concurrency", "rate_per_second", "burst"):
            if values[name] is not None:
                limit.add_metric([each.queue, name], values[name])
        used.add_metric([each.queue], each.slots_used)
        full.add_metric([each.queue], each.keys_full)
        if each.rate_next_ms is not None and now_ms is not None:
            wait.add_metric([each.queue], max(0, each.rate_next_ms - now_ms) / 1000)
    return [limit, used, full, wait]

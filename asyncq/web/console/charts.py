"""The overview's charts from the samples kept in the store: the samples of a window put in buckets, each series
turned into an SVG polyline's points (the template draws the SVG: no script, no CDN). Throughput and failures
are rates per minute (what ended, and the attempts that failed, in each bucket); depth is the last sample of each
bucket."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asyncq.core.samples import QueueFigures, Sample

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 580, 170, 48, 8, 8, 22
BUCKETS = 120
#: The windows a chart can show, by the name the page links with.
WINDOWS = {"1h": 3_600_000, "6h": 6 * 3_600_000, "24h": 24 * 3_600_000, "7d": 7 * 24 * 3_600_000}


@dataclass(frozen=True)
class Series:
    """One line: its name (and CSS class), its points (``"x,y x,y …"``) and its latest value."""

    name: str
    points: str
    last: float | None


@dataclass(frozen=True)
class Chart:
    """A chart ready to draw: its series, the top of its scale, its unit and the times at its edges."""

    key: str
    title: str
    unit: str
    series: list[Series]
    top: float
    start_ms: int
    end_ms: int
    samples: int
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    plot_bottom: int = HEIGHT - BOTTOM
    plot_right: int = WIDTH - RIGHT


Pick = Callable[[QueueFigures], float]


def _buckets(samples: Sequence[Sample], start_ms: int, end_ms: int) -> list[list[Sample]]:
    width = max(1, (end_ms - start_ms) / BUCKETS)
    found: list[list[Sample]] = [[] for _ in range(BUCKETS)]
    for sample in samples:
        if start_ms <= sample.at_ms <= end_ms:
            found[min(BUCKETS - 1, int((sample.at_ms - start_ms) / width))].append(sample)
    return found


def _total(sample: Sample, pick: Pick, queue: str | None) -> float:
    return sum(pick(figures) for figures in sample.queues if queue is None or figures.queue == queue)


def _series(values: list[float | None], top: float, name: str) -> Series:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    points = []
    for n, value in enumerate(values):
        if value is not None:
            x = LEFT + (n + 0.5) / BUCKETS * plot_w
            y = TOP + plot_h - value / top * plot_h
            points.append(f"{x:.1f},{y:.1f}")
    last = next((value for value in reversed(values) if value is not None), None)
    return Series(name, " ".join(points), last)


def rates(samples: Sequence[Sample], start_ms: int, end_ms: int, queue: str | None = None) -> Chart:
    """Jobs done and attempts failed per minute, per bucket."""
    buckets = _buckets(samples, start_ms, end_ms)
    minutes = max(1e-9, (end_ms - start_ms) / BUCKETS / 60_000)
    lines: dict[str, list[float | None]] = {}
    for name, pick in (("done", _done), ("failed", _failed), ("dead", _dead)):
        lines[name] = [
            sum(_total(sample, pick, queue) for sample in bucket) / minutes if bucket else None for bucket in buckets
        ]
    return _chart("rates", "Throughput and failures", "per minute", lines, start_ms, end_ms, len(samples))


def depth(samples: Sequence[Sample], start_ms: int, end_ms: int, queue: str | None = None) -> Chart:
    """Pending, ready and leased jobs at the last sample of each bucket."""
    buckets = _buckets(samples, start_ms, end_ms)
    lines: dict[str, list[float | None]] = {}
    for name, pick in (("pending", _pending), ("ready", _ready), ("leased", _leased)):
        lines[name] = [_total(bucket[-1], pick, queue) if bucket else None for bucket in buckets]
    return _chart("depth", "Queue depth", "jobs", lines, start_ms, end_ms, len(samples))


def _chart(
    key: str, title: str, unit: str, lines: dict[str, list[float | None]], start: int, end: int, count: int
) -> Chart:
    top = max([1.0, *(value for values in lines.values() for value in values if value is not None)])
    series = [_series(values, top, name) for name, values in lines.items()]
    return Chart(key, title, unit, series, top, start, end, count)


def _done(f: QueueFigures) -> float:
    return f.done


def _failed(f: QueueFigures) -> float:
    return f.failed


def _dead(f: QueueFigures) -> float:
    return f.dead


def _pending(f: QueueFigures) -> float:
    return f.pending


def _ready(f: QueueFigures) -> float:
    return f.ready


def _leased(f: QueueFigures) -> float:
    return f.leased


def sparkline(samples: Sequence[Sample], queue: str, start_ms: int, end_ms: int, width: int = 120) -> str:
    """A queue's depth over the window as a small polyline's points (``width`` × 24)."""
    buckets = _buckets(samples, start_ms, end_ms)
    values = [_total(bucket[-1], _pending, queue) if bucket else None for bucket in buckets]
    top = max([1.0, *(value for value in values if value is not None)])
    points = [
        f"{n / (BUCKETS - 1) * width:.1f},{22 - value / top * 20:.1f}"
        for n, value in enumerate(values)
        if value is not None
    ]
    return " ".join(points)

"""A queue's flow-control state, as stores keep it (no I/O here): whether it is paused (when, by whom, why) and
its ``max_wait``, how long it keeps its finished jobs per state (``core.retention``), its concurrency and rate
limits (``core.flow_limits``), and the audit of every operator move on a queue.

The state is a row per queue that the claim statement itself reads (``docs/flow-control.md``): a paused queue is
claimed from by no process on any host, from the first claim that begins after the pause committed.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncq.core.flow_limits import Limits
from asyncq.core.retention import Windows

#: The moves on a queue that its audit keeps.
PAUSE = "pause"
RESUME = "resume"
MAX_WAIT = "max_wait"
RETENTION = "retention"
RETENTION_CLEAR = "retention_clear"
LIMITS = "limits"
QUEUE_ACTIONS = (PAUSE, RESUME, MAX_WAIT, RETENTION, RETENTION_CLEAR, LIMITS)


@dataclass(frozen=True)
class QueueSettings:
    """One queue's stored settings: ``paused_at`` (ms; ``None`` while it runs), who paused it (``paused_by``) and
    why (``note``), ``max_wait_ms`` (``None``: strict priorities), the windows in ms per terminal state of the
    queue's own retention rule (each ``None`` also when it has none: ``Queue.retention_rules`` tells the two apart,
    and holds the default and the tasks' rules), and its limits (``limit_*``; ``None``: no such limit,
    ``core.flow_limits.Limits``)."""

    queue: str
    paused_at: int | None
    paused_by: str | None
    note: str | None
    max_wait_ms: int | None
    retain_done_ms: int | None = None
    retain_dead_ms: int | None = None
    retain_cancelled_ms: int | None = None
    limit_concurrency: int | None = None
    limit_per_key: int | None = None
    limit_rate: int | None = None
    limit_per_ms: int | None = None
    limit_burst: int | None = None

    @property
    def retention(self) -> Windows:
        return Windows(self.retain_done_ms, self.retain_dead_ms, self.retain_cancelled_ms)

    @property
    def limits(self) -> Limits:
        return Limits(self.limit_concurrency, self.limit_per_key, self.limit_rate, self.limit_per_ms, self.limit_burst)

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


@dataclass(frozen=True)
class QueueAuditEntry:
    """One operator move on a queue: ``action`` (``pause``, ``resume``, ``max_wait``, ``retention``,
    ``retention_clear``, ``limits``), when, who and why; ``max_wait_ms`` is the value a ``max_wait`` move set
    (``None`` otherwise, or when it cleared it), the ``retain_*_ms`` the windows a ``retention`` move set (``None``:
    for ever, and on every other move), the ``limit_*`` the limits a ``limits`` move set (``None``: none, and on
    every other move). A retention move's scope: ``queue`` (``"*"``: every queue, the default rule) and ``task`` (a
    task's rule in that queue; ``None`` otherwise)."""

    seq: int
    queue: str
    action: str
    at_ms: int
    actor: str
    note: str
    max_wait_ms: int | None
    retain_done_ms: int | None = None
    retain_dead_ms: int | None = None
    retain_cancelled_ms: int | None = None
    task: str | None = None
    limit_concurrency: int | None = None
    limit_per_key: int | None = None
    limit_rate: int | None = None
    limit_per_ms: int | None = None
    limit_burst: int | None = None

    @property
    def retention(self) -> Windows:
        return Windows(self.retain_done_ms, self.retain_dead_ms, self.retain_cancelled_ms)

    @property
    def limits(self) -> Limits:
        return Limits(self.limit_concurrency, self.limit_per_key, self.limit_rate, self.limit_per_ms, self.limit_burst)


def pause_refused(queue: str, paused: bool, settings: QueueSettings | None) -> str | None:
    """Why pausing (``paused``) or resuming ``queue`` changes nothing (``None``: it changes its state)."""
    now_paused = settings is not None and settings.paused
    if paused and now_paused:
        assert settings is not None
        return f"queue {queue!r} is already paused (by {settings.paused_by}: {settings.note})"
    if not paused and not now_paused:
        return f"queue {queue!r} is not paused"
    return None

"""A queue's flow-control state, as stores keep it (no I/O here): whether it is paused (when, by whom, why) and
its ``max_wait``, and the audit of every operator move on a queue.

The state is a row per queue that the claim statement itself reads (``docs/flow-control.md``): a paused queue is
claimed from by no process on any host, from the first claim that begins after the pause committed.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The moves on a queue that its audit keeps.
PAUSE = "pause"
RESUME = "resume"
MAX_WAIT = "max_wait"
QUEUE_ACTIONS = (PAUSE, RESUME, MAX_WAIT)


@dataclass(frozen=True)
class QueueSettings:
    """One queue's stored settings: ``paused_at`` (ms; ``None`` while it runs), who paused it (``paused_by``) and
    why (``note``), and ``max_wait_ms`` (``None``: strict priorities)."""

    queue: str
    paused_at: int | None
    paused_by: str | None
    note: str | None
    max_wait_ms: int | None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


@dataclass(frozen=True)
class QueueAuditEntry:
    """One operator move on a queue: ``action`` (``pause``, ``resume``, ``max_wait``), when, who and why;
    ``max_wait_ms`` is the value a ``max_wait`` move set (``None`` otherwise, or when it cleared it)."""

    seq: int
    queue: str
    action: str
    at_ms: int
    actor: str
    note: str
    max_wait_ms: int | None


def pause_refused(queue: str, paused: bool, settings: QueueSettings | None) -> str | None:
    """Why pausing (``paused``) or resuming ``queue`` changes nothing (``None``: it changes its state)."""
    now_paused = settings is not None and settings.paused
    if paused and now_paused:
        assert settings is not None
        return f"queue {queue!r} is already paused (by {settings.paused_by}: {settings.note})"
    if not paused and not now_paused:
        return f"queue {queue!r} is not paused"
    return None

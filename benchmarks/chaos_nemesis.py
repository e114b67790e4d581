"""The chaos harness's nemesis: a seeded schedule of SIGKILLs and SIGSTOPs, and the recovery it measures.

The schedule, in order (every random choice from one ``random.Random(seed)``); as each step starts, its part
of the jobs is enqueued (``feed``), so that every fault has work to hit however fast the machine drains:

1. worker kills: every 200-300 ms a random worker holding leases is SIGKILLed and its slot restarted at once
   (when none holds a lease, that kill is skipped: a worker still starting up has nothing to lose);
2. the same, and every 1-2 s the receiver is SIGKILLed too and restarted after 50-300 ms (same port);
3. a worker holding leases (and not the write lock) is SIGSTOPped past its lease, then resumed (SIGCONT);
4. a worker is SIGSTOPped while it holds the store's write lock (``Store.write_lock_holder``: the lock's owner
   is asked, the process stopped, and the lock asked again while it is frozen; a process that let go in
   between is resumed and the catch tried again), held for ``stop_holding_lock_s``, then resumed. Meanwhile
   the one job held back from every part is enqueued (the probe), to see whether a producer gets through.

On PostgreSQL (``server``: ``chaos_pg.PostgresServer``) the kill phases also hurt the server, on a second
``random.Random(seed + 1)`` so the worker kills' schedule is the same as on SQLite: every 0.5-1 s every client
backend is ended (``pg_terminate_backend``), and once in each kill phase, at a random 30-70 % of it, the server
is crash-restarted (``pg_ctl restart -m immediate``; the nemesis waits until it accepts connections again). Step 4's
"write lock" is, on PostgreSQL, a transaction held open (``PostgresStore.write_lock_holder``).

Meanwhile the nemesis restarts any process that exited on its own (``Fleet.restart_exited``), and a thread
polls the jobs the killed workers held: the time from a kill to the job's re-claim (a new token) is the
recovery time.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from chaos_fleet import Fleet, Slot, wait_stopped
from chaos_store import Held

TICK = 0.02  # how often the nemesis looks for exited processes and re-claimed jobs
RECEIVER_KILLS_MIN = 2  # a receiver phase kills the receiver at least this often, however slow its other steps ran


class Store(Protocol):
    """What the nemesis asks of a store (``chaos_store``)."""

    def leases_of(self, owner: str) -> dict[str, Held]: ...
    def lease_owners(self) -> set[str]: ...
    def lease_states(self, ids: list[str]) -> dict[str, tuple[str, int]]: ...
    def write_lock_holder(self, candidates: Collection[int] = (), *, fresh: bool = False) -> int | None: ...
    def counts(self) -> dict[str, int]: ...


class Server(Protocol):
    """What the nemesis does to a store's server (``chaos_pg.PostgresServer``)."""

    @property
    def can_restart(self) -> bool: ...
    def end_backends(self) -> None: ...
    def crash_restart(self) -> None: ...


@dataclass
class Plan:
    """The nemesis's sizes, in seconds."""

    kill_phase_s: float
    receiver_phase_s: float
    stop_past_lease_s: float
    stop_holding_lock_s: float


@dataclass
class RecoveryWatch:
    """The jobs killed workers held, polled every ``TICK`` in a thread of its own (so that a blocking step
    of the nemesis, such as a receiver's restart, does not delay the measure) until each one is re-claimed (a
    new token: its recovery time is from the kill to the poll that saw it) or swept dead (same token)."""

    store: Store
    outstanding: dict[str, tuple[float, int]] = field(default_factory=dict)  # id: (killed at, token)
    recovery_ms: list[float] = field(default_factory=list)
    orphaned: int = 0
    swept: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _done: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="recovery-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (after one last poll)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()

    def add(self, leases: dict[str, Held], killed_at: float) -> None:
        with self._lock:
            self.orphaned += len(leases)
            for job_id, (token, _attempts) in leases.items():
                if job_id in self.outstanding:  # re-claimed and orphaned again between two polls
                    self.recovery_ms.append((killed_at - self.outstanding[job_id][0]) * 1000)
                self.outstanding[job_id] = (killed_at, token)

    def _watch(self) -> None:
        while not self._done.wait(TICK):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            ids = list(self.outstanding)
        states = self.store.lease_states(ids) if ids else {}
        now = time.monotonic()
        with self._lock:
            for job_id, (status, token) in states.items():
                killed_at, orphan_token = self.outstanding.get(job_id, (now, token))
                if token != orphan_token:
                    self.recovery_ms.append((now - killed_at) * 1000)
                elif status != "leased":
                    self.swept += 1
                else:
                    continue
                del self.outstanding[job_id]


@dataclass
class Nemesis:
    """Runs a ``Plan`` against a ``Fleet``; counts what it did."""

    fleet: Fleet
    store: Store
    rng: random.Random
    watch: RecoveryWatch
    kills: int = 0
    kills_skipped: int = 0  # kill times at which no worker held a lease
    receiver_kills: int = 0
    stops: list[dict[str, Any]] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)
    held_at_kills: list[tuple[str, Held]] = field(default_factory=list)  # each lease a killed worker held
    server: Server | None = None  # the server faults, on a store that has a server
    server_rng: random.Random = field(default_factory=random.Random)

    def run(self, plan: Plan, feed: Callable[[str], None], enqueue_probe: Callable[[], None]) -> None:
        """The four steps in order (a stop of 0 seconds is skipped). As each starts, ``feed(step)`` enqueues
        its part of the jobs, and the backlog is noted."""
        self.begin("worker_kills", feed)
        self.kill_phase(plan.kill_phase_s, receiver=False)
        self.begin("receiver_kills", feed)
        self.kill_phase(plan.receiver_phase_s, receiver=True)
        self.begin("stop_past_lease", feed)
        if plan.stop_past_lease_s > 0:
            self.stop_past_lease(plan.stop_past_lease_s)
        self.begin("stop_holding_lock", feed)
        if plan.stop_holding_lock_s > 0:
            self.stop_holding_lock(plan.stop_holding_lock_s, enqueue_probe)
        else:
            self.run_probe(enqueue_probe, during=None)
        if not self.probe["ok"]:  # it must get in now that nothing is stopped
            enqueue_probe()
            self.probe["retried_after_resume"] = True

    def begin(self, step: str, feed: Callable[[str], None]) -> None:
        feed(step)
        self.note_backlog(step)

    def note_backlog(self, step: str) -> None:
        """How many jobs are pending or leased as ``step`` starts (a fault with no work to hit proves little)."""
        counts = self.store.counts()
        self.backlog[step] = counts["pending"] + counts["leased"]

    def tick(self) -> None:
        self.fleet.restart_exited()

    def idle_until(self, moment: float) -> None:
        """Keep ticking until ``moment`` (monotonic): the schedule's own pace."""
        while (now := time.monotonic()) < moment:
            self.tick()
            time.sleep(min(TICK, moment - now))

    # -- kills ------------------------------------------------------------------------------------------

    def kill_phase(self, seconds: float, *, receiver: bool) -> None:
        now = time.monotonic()
        end, next_kill = now + seconds, now + self.rng.uniform(0.2, 0.3)
        next_receiver = now + self.rng.uniform(1.0, 2.0) if receiver else float("inf")
        next_end, restart_at = self.server_schedule(now, seconds)
        receiver_kills_before = self.receiver_kills
        while True:
            self.idle_until(min(next_kill, next_receiver, end, next_end, restart_at))
            # The restart is due before the phase ends: it runs even when a slow step (a kill, a backend sweep on a
            # loaded machine) carried the clock past both, so that every phase restarts the server once.
            if self.server is not None and time.monotonic() >= restart_at:
                self.server.crash_restart()
                restart_at = float("inf")
            if time.monotonic() >= end:
                # Likewise the receiver's kills: a slow step (the server's crash-restart took seconds beside load)
                # had left a receiver phase of 6 s room for one; those still due run now.
                while receiver and self.receiver_kills - receiver_kills_before < RECEIVER_KILLS_MIN:
                    self.kill_receiver(self.rng.uniform(0.05, 0.3))
                return
            if self.server is not None and time.monotonic() >= next_end:
                self.server.end_backends()
                next_end = time.monotonic() + self.server_rng.uniform(0.5, 1.0)
            if time.monotonic() >= next_kill:
                self.kill_a_worker()
                next_kill = time.monotonic() + self.rng.uniform(0.2, 0.3)
            if time.monotonic() >= next_receiver:
                self.kill_receiver(self.rng.uniform(0.05, 0.3))
                next_receiver = time.monotonic() + self.rng.uniform(1.0, 2.0)

    def server_schedule(self, now: float, seconds: float) -> tuple[float, float]:
        """When the first backends are ended and when the server is crash-restarted (never: ``inf``)."""
        if self.server is None:
            return float("inf"), float("inf")
        restart_at = now + self.server_rng.uniform(0.3, 0.7) * seconds if self.server.can_restart else float("inf")
        return now + self.server_rng.uniform(0.5, 1.0), restart_at

    def kill_a_worker(self) -> None:
        """Kill a random worker among those holding leases. A worker still starting up holds nothing to lose,
        and at four kills a second on two busy cores most kills would find one starting: those are skipped."""
        owners = self.store.lease_owners()
        working = [slot for slot in self.fleet.slots if slot.owner in owners]
        if working:
            self.kill_worker(self.rng.choice(working))
        else:
            self.kills_skipped += 1

    def kill_worker(self, slot: Slot) -> None:
        """SIGKILL, note the leases it died with, restart the slot."""
        self.fleet.kill(slot)
        killed_at = time.monotonic()
        self.kills += 1
        held = self.store.leases_of(slot.owner)  # final: the process is reaped, nothing renews or finishes them
        self.held_at_kills += held.items()
        self.watch.add(held, killed_at)
        self.fleet.start(slot)

    def kill_receiver(self, down_s: float) -> None:
        self.fleet.kill_receiver()
        self.receiver_kills += 1
        self.idle_until(time.monotonic() + down_s)
        self.fleet.start_receiver()

    # -- stops ------------------------------------------------------------------------------------------

    def stop_past_lease(self, seconds: float) -> None:
        """SIGSTOP a worker that holds leases, but not the write lock (that is the next step), for
        ``seconds``, then SIGCONT it."""
        # Up to 30 s: after the kill phases (and on PostgreSQL its restarts) the workers may all be starting again.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.backlog["stop_past_lease"]:
            slot = self.rng.choice(self.fleet.slots)
            if slot.process is not None and self.store.leases_of(slot.owner):
                pid = slot.process.pid
                os.kill(pid, signal.SIGSTOP)
                if wait_stopped(pid) and self.store.write_lock_holder([pid], fresh=True) != pid:
                    held = len(self.store.leases_of(slot.owner))
                    self.idle_until(time.monotonic() + seconds)
                    os.kill(pid, signal.SIGCONT)
                    stop = {"kind": "past_lease", "owner": slot.owner, "seconds": seconds, "leases": held}
                    self.stops.append(stop | {"holding_write_lock": False})
                    return
                os.kill(pid, signal.SIGCONT)  # caught holding the write lock: try another moment
            self.idle_until(time.monotonic() + TICK)
        self.stops.append({"kind": "past_lease", "skipped": "no worker held a lease (and not the write lock) in 30 s"})

    def catch_write_lock(self, seconds: float) -> tuple[Slot | None, int]:
        """Stop a worker holding the write lock (checked while it is frozen); the slot and the near misses."""
        deadline, misses, next_tick = time.monotonic() + seconds, 0, 0.0
        pids = self.fleet.pids()
        while time.monotonic() < deadline:
            holder = self.store.write_lock_holder(pids)
            if holder in pids:
                os.kill(holder, signal.SIGSTOP)
                if wait_stopped(holder) and self.store.write_lock_holder([holder], fresh=True) == holder:
                    return pids[holder], misses
                os.kill(holder, signal.SIGCONT)  # it committed between the question and the stop
                misses += 1
            if time.monotonic() >= next_tick:
                self.tick()
                pids, next_tick = self.fleet.pids(), time.monotonic() + TICK
            time.sleep(0.0002)
        return None, misses

    def stop_holding_lock(self, seconds: float, enqueue_probe: Callable[[], None]) -> None:
        """SIGSTOP a worker while it holds the write lock for ``seconds``; enqueue the probe job meanwhile."""
        slot, misses = self.catch_write_lock(30.0)
        if slot is None or slot.process is None:
            self.stops.append({"kind": "holding_write_lock", "skipped": "not caught in 30 s", "misses": misses})
            self.run_probe(enqueue_probe, during=None)
        else:
            exits_before, pid = len(self.fleet.self_exits), slot.process.pid
            prober = threading.Thread(target=self.run_probe, args=(enqueue_probe, "holding_write_lock"))
            prober.start()
            self.idle_until(time.monotonic() + seconds)
            os.kill(pid, signal.SIGCONT)
            prober.join()
            stop = {"kind": "holding_write_lock", "owner": slot.owner, "seconds": seconds, "verified": True}
            stop |= {"misses": misses, "self_exits_meanwhile": len(self.fleet.self_exits) - exits_before}
            self.stops.append(stop)

    def run_probe(self, enqueue_probe: Callable[[], None], during: str | None) -> None:
        """Enqueue the probe job; its outcome and how long it took go to ``probe``."""
        started = time.monotonic()
        try:
            enqueue_probe()
            self.probe = {"during": during, "ok": True}
        except Exception as error:
            self.probe = {"during": during, "ok": False, "error": f"{type(error).__name__}: {error}"}
        self.probe["seconds"] = round(time.monotonic() - started, 3)

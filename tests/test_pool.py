"""The asyncio worker pool in one process, on a real SQLite file.

Handlers synchronise with the tests through asyncio events. Queue time is an injected clock ``t[0]`` where a
test is about queue time (retry delays, a lease taken away, a renewal racing a finish). Only the renewal test
uses the wall clock and lets three lease lengths of real time pass, which is its point; ``job_timeout`` is an
asyncio timeout in real seconds.

Two tests pin down pool bugs found while writing these tests, now fixed: the concurrency bound across several
queues, and a finish racing a lease renewal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import threading
import time
import typing
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import T0
from holding import Holding
from waiting import eventually

from asyncq.core.jobs import JobSpec
from asyncq.errors import Permanent, Retryable
from asyncq.queue import Queue
from asyncq.tasks.asgi import LifespanOptions
from asyncq.worker.pool import JobContext, Pool, RetryPolicy
from asyncq.worker.settings import PoolOptions, PoolSettings, settings_fields

pytestmark = pytest.mark.timeout(30)

NO_JITTER = RetryPolicy(jitter=lambda: 0.0)


async def burst(pool: Pool, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        await pool.run(burst=True)


async def lease_until(queue: Queue, job_id: str) -> int | None:
    job = await queue.get(job_id)
    return None if job is None else job.lease_until


def audit_rows(path: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT id, note, action FROM asyncq_audit ORDER BY seq").fetchall()
    finally:
        con.close()


Deliveries = list[tuple[str, int, int]]


def recording(deliveries: Deliveries, then: Callable[[Any], Awaitable[object]]) -> Any:
    async def handler(body: Any, context: JobContext) -> None:
        deliveries.append((context.id, context.attempt, context.token))
        await then(body)

    return handler


async def fail(body: Any) -> None:
    raise RuntimeError(f"cannot handle {body!r}")


async def succeed(body: Any) -> None:
    return None


# --- outcomes ----------------------------------------------------------------------------------------


async def test_a_handler_that_always_fails_ends_exhausted_after_max_attempts_and_redrive_revives_it(
    queue: Queue, path: Path
) -> None:
    deliveries: Deliveries = []
    pool = Pool(queue, concurrency=4, retry=NO_JITTER)
    pool.register("default", recording(deliveries, fail))
    await queue.enqueue("job", {"n": 1}, max_attempts=3)

    await burst(pool)

    assert deliveries == [("job", 1, 1), ("job", 2, 2), ("job", 3, 3)]
    job = await queue.get("job")
    assert job is not None
    assert (job.status, job.reason, job.attempts) == ("dead", "exhausted", 3)
    assert pool.counters.handler_errors == 3
    assert pool.counters.finished == {"pending": 2, "dead": 1}

    assert (await queue.redrive("job", "bug-fixed")).note == "bug-fixed"
    assert audit_rows(path) == [("job", "bug-fixed", "redrive")]
    pool.register("default", recording(deliveries, succeed))
    await burst(pool)
    assert deliveries[3:] == [("job", 1, 4)]
    job = await queue.get("job")
    assert job is not None and (job.status, job.attempts) == ("done", 1)


async def test_permanent_makes_the_job_dead_at_once(queue: Queue) -> None:
    deliveries: Deliveries = []

    async def refuse(body: Any) -> None:
        raise Permanent("malformed order")

    pool = Pool(queue, retry=NO_JITTER)
    pool.register("default", recording(deliveries, refuse))
    await queue.enqueue("job", {}, max_attempts=5)
    await burst(pool)
    job = await queue.get("job")
    assert job is not None and (job.status, job.reason, job.attempts) == ("dead", "permanent", 1)
    assert deliveries == [("job", 1, 1)]
    assert pool.counters.handler_errors == 0


async def test_the_pools_records_of_a_job_carry_its_fields(queue: Queue, caplog: pytest.LogCaptureFixture) -> None:
    """The pool's per-job warnings name the job in structured fields (``job_id``, ``queue``, ``attempt``,
    ``outcome``), as the task layer's records do, so that a JSON formatter shows them."""

    async def refuse(body: Any, job: Any) -> None:
        raise Permanent("malformed order")

    pool = Pool(queue, retry=NO_JITTER)
    pool.register("default", refuse)
    await queue.enqueue("job", {}, max_attempts=5)
    with caplog.at_level(logging.WARNING, logger="asyncq.worker.pool"):
        await burst(pool)
    found = [
        (record.getMessage().split(":")[0], record.job_id, record.queue, record.attempt, record.outcome)  # type: ignore[attr-defined]
        for record in caplog.records
        if record.name == "asyncq.worker.pool"
    ]
    assert found == [
        ("job job failed permanently", "job", "default", 1, "permanent"),
        ("job job token 1 -> dead after attempt 1", "job", "default", 1, "dead"),
    ]


async def test_retryable_asks_for_its_own_delay_capped_by_the_policy(queue: Queue, clock: list[int]) -> None:
    delays = iter([5_000, 10**9])
    deliveries: Deliveries = []

    async def later(body: Any) -> None:
        delay = next(delays, None)
        if delay is not None:
            raise Retryable("rate limited", delay_ms=delay)

    pool = Pool(queue, retry=RetryPolicy(base=1, cap=20, jitter=lambda: 0.0))
    pool.register("default", recording(deliveries, later))
    await queue.enqueue("job", {}, max_attempts=5)

    await burst(pool)  # attempt 1 asks for 5 s; the clock stands still, so the burst ends
    job = await queue.get("job")
    assert job is not None and (job.status, job.reason, job.available_at) == ("pending", "retry", clock[0] + 5_000)

    clock[0] += 5_000
    await burst(pool)  # attempt 2 asks for far too long: the policy's cap applies
    job = await queue.get("job")
    assert job is not None and job.available_at == clock[0] + 20_000

    clock[0] += 20_000
    await burst(pool)
    job = await queue.get("job")
    assert job is not None and (job.status, job.attempts) == ("done", 3)
    assert [attempt for _id, attempt, _token in deliveries] == [1, 2, 3]


async def test_an_unexpected_exception_is_retried_with_the_policys_backoff(queue: Queue, clock: list[int]) -> None:
    failures = iter([ValueError("bad"), KeyError("missing")])
    deliveries: Deliveries = []

    async def flaky(body: Any) -> None:
        error = next(failures, None)
        if error is not None:
            raise error

    pool = Pool(queue, retry=RetryPolicy(base=1, cap=60, jitter=lambda: 0.5))
    pool.register("default", recording(deliveries, flaky))
    await queue.enqueue("job", {}, max_attempts=3)

    await burst(pool)
    job = await queue.get("job")
    assert job is not None and job.available_at == clock[0] + 500  # 1000 * 2**0 * 0.5
    clock[0] += 500
    await burst(pool)
    job = await queue.get("job")
    assert job is not None and job.available_at == clock[0] + 1_000  # 1000 * 2**1 * 0.5
    clock[0] += 1_000
    await burst(pool)
    job = await queue.get("job")
    assert job is not None and (job.status, job.attempts) == ("done", 3)
    assert pool.counters.handler_errors == 2


async def test_job_timeout_turns_a_hanging_handler_into_a_retry(queue: Queue) -> None:
    deliveries: Deliveries = []
    cancelled = asyncio.Event()

    async def hang_once(body: Any) -> None:
        if len(deliveries) > 1:
            return
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    pool = Pool(queue, job_timeout=0.2, retry=NO_JITTER)
    pool.register("default", recording(deliveries, hang_once))
    await queue.enqueue("job", {})
    await burst(pool)
    assert cancelled.is_set()
    assert deliveries == [("job", 1, 1), ("job", 2, 2)]
    job = await queue.get("job")
    assert job is not None and (job.status, job.attempts) == ("done", 2)
    assert pool.counters.handler_errors == 1


# --- running modes -----------------------------------------------------------------------------------


def peak_counting(seen: list[tuple[str, int]]) -> tuple[Any, Callable[[], int]]:
    """A handler that records each job and the most handlers it saw running at once."""
    active, peak = 0, 0

    async def handler(body: Any, context: JobContext) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0)  # let the other claimed handlers start too
        seen.append((context.queue, body["n"]))
        active -= 1

    return handler, lambda: peak


async def test_burst_mode_drains_the_queue_and_returns(queue: Queue) -> None:
    seen: list[tuple[str, int]] = []
    handler, peak = peak_counting(seen)
    pool = Pool(queue, concurrency=8)
    pool.register("mail", handler)
    await queue.enqueue_many(JobSpec(f"mail-{n}", {"n": n}, queue="mail") for n in range(200))
    await queue.enqueue("elsewhere", {"n": 0}, queue="unhandled")

    await burst(pool)

    assert sorted(seen) == [("mail", n) for n in range(200)]
    assert 1 < peak() <= 8
    assert pool.running == 0
    assert pool.counters.claimed == 200
    assert pool.counters.finished == {"done": 200}
    assert pool.counters.commits < 200  # finishes and claims are grouped into shared commits
    stats = await queue.stats()
    assert stats.by_status == {"pending": 1, "leased": 0, "done": 200, "dead": 0, "waiting": 0}


async def test_a_commit_carries_a_batch_of_fast_jobs_not_one_round_of_the_slots(queue: Queue) -> None:
    pool = Pool(queue, concurrency=16)
    pool.register("default", recording([], succeed))
    await queue.enqueue_many(JobSpec(f"job-{n}", {}) for n in range(2000))

    await burst(pool)

    assert pool.counters.finished == {"done": 2000}
    # A round of 16 slots a commit would be 125 commits; a batch of 128 results makes 16 or 17 of them, plus
    # the starving slots' commits as the queue runs dry. Only a linger (60 ms) run out early could add more.
    assert pool.counters.commits <= 40, pool.counters


async def test_a_small_pool_holds_a_few_rounds_of_leases_not_a_whole_batch(queue: Queue) -> None:
    held: list[int] = []

    async def count_leased(body: object, context: JobContext) -> None:
        held.append((await queue.stats()).by_status["leased"])

    pool = Pool(queue, concurrency=1)
    assert (pool.batch, pool.prefetch) == (8, 9)  # eight rounds of its one slot, and that round
    pool.register("default", count_leased)
    await queue.enqueue_many(JobSpec(f"job-{n}", {}) for n in range(100))

    await burst(pool)

    assert pool.counters.finished == {"done": 100}
    # The running job, the buffer and results not yet committed: never the 129 a batch of 128 would hold.
    assert max(held) <= 1 + 9 + 8, held
    assert pool.counters.commits >= 100 // 9, pool.counters


async def test_more_slots_than_a_claim_may_take_are_filled_over_several_commits(queue: Queue) -> None:
    # 600 slots and their default buffer ask for more than a claim's limit (1,000 jobs): the pool used to
    # raise ValueError from its first claim whenever concurrency was over 500.
    pool = Pool(queue, concurrency=600)
    assert pool.prefetch == 1000  # a batch and a round would be 1,200: the most a claim may take
    pool.register("default", recording([], succeed))
    await queue.enqueue_many(JobSpec(f"job-{n}", {}) for n in range(1000))
    await queue.enqueue_many(JobSpec(f"later-{n}", {}) for n in range(500))

    await burst(pool)

    assert pool.counters.finished == {"done": 1500}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"lease": 0.003}, "lease"),
        ({"prefetch": -1}, "prefetch"),
        ({"prefetch": 1001}, "prefetch"),
        ({"linger": 0}, "linger"),
        ({"linger": float("nan")}, "linger"),
        ({"linger": "5ms"}, "linger"),
        ({"lease": 1.0, "linger": 0.501}, "half the lease"),
        ({"owner": "has space"}, "owner"),
    ],
)
async def test_bad_pool_options_are_refused_before_anything_is_claimed(
    queue: Queue, options: dict[str, Any], message: str
) -> None:
    await queue.enqueue("job", {})
    with pytest.raises(ValueError, match=message):
        Pool(queue, **options)
    job = await queue.get("job")
    assert job is not None and (job.status, job.attempts, job.token) == ("pending", 0, 0)


def test_pool_options_are_the_settings_fields_with_their_types() -> None:
    """``PoolOptions`` (what mypy checks ``Pool(queue, **options)``, ``App.pool`` … against) is ``PoolSettings``'
    fields, each with its type, and the lifespan's options hold them all."""
    fields = {name: hint for name, hint in typing.get_type_hints(PoolSettings).items() if name in settings_fields()}
    assert typing.get_type_hints(PoolOptions) == fields
    assert list(PoolOptions.__annotations__) == settings_fields() and PoolOptions.__required_keys__ == frozenset()
    assert PoolOptions.__optional_keys__ <= LifespanOptions.__optional_keys__


async def test_a_pool_takes_its_settings_as_one_value_or_as_keywords_not_both(queue: Queue) -> None:
    settings = PoolSettings(concurrency=3, owner="w1", lease=2)
    pool = Pool(queue, settings)
    assert (pool.settings, pool.concurrency, pool.owner, pool.lease_ms) == (settings, 3, "w1", 2000)
    assert Pool(queue, concurrency=3, owner="w1", lease=2).settings == settings
    with pytest.raises(TypeError, match="not both"):
        Pool(queue, settings, concurrency=3)
    with pytest.raises(TypeError, match="must be a PoolSettings"):
        Pool(queue, {"concurrency": 3})  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.concurrency = 4  # type: ignore[misc]
    assert Pool(queue, PoolSettings()).owner != Pool(queue, PoolSettings()).owner  # a random name per pool


async def test_the_default_linger_is_60_ms_or_a_tenth_of_a_short_lease(queue: Queue) -> None:
    assert Pool(queue).linger == 0.06
    assert Pool(queue, lease=0.2).linger == 0.02  # a waiting result's lease is not renewed
    assert Pool(queue, linger=0.001).linger == 0.001
    assert Pool(queue, lease=1.0, linger=0.5).linger == 0.5  # half the lease: the most a result may wait
    assert Pool(queue, concurrency=16).prefetch == 144  # a batch of 128 and a round of 16
    assert (Pool(queue, concurrency=4).batch, Pool(queue, concurrency=4).prefetch) == (32, 36)  # eight rounds
    assert Pool(queue, concurrency=200).prefetch == 400  # above 128 slots a batch is a round
    assert Pool(queue, concurrency=200).batch == 200


async def test_concurrency_bounds_the_handlers_running_across_several_queues(queue: Queue) -> None:
    seen: list[tuple[str, int]] = []
    handler, peak = peak_counting(seen)
    pool = Pool(queue, concurrency=8)
    pool.register("mail", handler)
    pool.register("sms", handler)
    await queue.enqueue_many(JobSpec(f"{q}-{n}", {"n": n}, queue=q) for q in ("mail", "sms") for n in range(50))

    await burst(pool)

    assert sorted(seen) == sorted((q, n) for q in ("mail", "sms") for n in range(50))
    assert peak() <= 8


async def test_run_once_claims_one_batch_runs_it_and_commits_its_finishes(queue: Queue) -> None:
    ran: list[str] = []

    async def handler(body: Any, context: JobContext) -> None:
        ran.append(context.id)

    pool = Pool(queue, concurrency=3)
    with pytest.raises(ValueError):
        await pool.run_once()  # no handler registered
    pool.register("default", handler)
    for n in range(5):
        await queue.enqueue(f"job-{n}", {})

    assert await pool.run_once() == 3
    assert sorted(ran) == ["job-0", "job-1", "job-2"]
    assert (await queue.stats()).by_status == {"pending": 2, "leased": 0, "done": 3, "dead": 0, "waiting": 0}
    assert await pool.run_once() == 2
    assert await pool.run_once() == 0
    assert (await queue.stats()).by_status == {"pending": 0, "leased": 0, "done": 5, "dead": 0, "waiting": 0}


async def test_an_idle_pool_wakes_at_once_on_an_enqueue_in_the_same_process(queue: Queue) -> None:
    handled = asyncio.Event()

    async def handler(body: Any, context: JobContext) -> None:
        handled.set()

    pool = Pool(queue, poll_min=5.0, poll_max=5.0)
    pool.register("default", handler)
    running = asyncio.create_task(pool.run())
    try:
        await eventually(lambda: pool.counters.commits >= 1, "the first (empty) claim")
        started = time.monotonic()
        await queue.enqueue("job", {})
        async with asyncio.timeout(4):  # well inside the 5 s poll: only the wake-up can explain it
            await handled.wait()
        assert time.monotonic() - started < 1.0
    finally:
        pool.stop()
        async with asyncio.timeout(5):
            await running
    job = await queue.get("job")
    assert job is not None and job.status == "done"


async def test_stop_lets_jobs_in_flight_finish_and_claims_nothing_more(queue: Queue) -> None:
    handler = Holding()
    started, release = handler.started, handler.release

    pool = Pool(queue, concurrency=1)
    pool.register("default", handler)
    await queue.enqueue("first", {})
    await queue.enqueue("second", {})
    running = asyncio.create_task(pool.run())
    async with asyncio.timeout(5):
        await started.wait()
    pool.stop()
    await asyncio.sleep(0)
    assert not running.done()  # still waiting for the job in flight
    release.set()
    async with asyncio.timeout(5):
        await running
    first, second = await queue.get("first"), await queue.get("second")
    assert first is not None and first.status == "done"
    assert second is not None and second.status == "pending"


async def test_cancelling_the_pool_abandons_jobs_in_flight_unfinished(queue: Queue, path: Path) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(body: Any, context: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    pool = Pool(queue, owner="w1", lease=10)
    pool.register("default", handler)
    await queue.enqueue("job", {})
    running = asyncio.create_task(pool.run())
    async with asyncio.timeout(5):
        await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cancelled.is_set()
    job = await queue.get("job")
    assert job is not None and (job.status, job.owner, job.token) == ("leased", "w1", 1)  # left to expire
    assert pool.running == 0


# --- leases ------------------------------------------------------------------------------------------


async def test_a_handler_running_three_leases_long_is_never_reclaimed(path: Path) -> None:
    release = asyncio.Event()
    deliveries: Deliveries = []
    # durability="normal": no fsync per commit, so a slow disk shared with other tests cannot eat the 200 ms
    # the renewer leaves itself; what is under test is the renewal, not the disk.
    async with (
        await Queue.open(path, durability="normal") as queue,
        await Queue.open(path, durability="normal") as other_worker,
    ):
        pool = Pool(queue, owner="w1", lease=0.4)
        pool.register("default", recording(deliveries, lambda body: release.wait()))
        await queue.enqueue("job", {})
        running = asyncio.create_task(pool.run(burst=True))

        await eventually(lambda: bool(deliveries), "the handler to start")
        began = time.monotonic()
        tries = 0
        while time.monotonic() - began < 1.2:  # three lease lengths of real time
            assert await other_worker.claim("w2", lease=0.4) == []
            tries += 1
            await asyncio.sleep(0.05)  # claims tried over three lease lengths of real time: time is under test
        # Release the handler just after a renewal has landed (a result racing a renewal is covered below).
        last_renewal = await lease_until(other_worker, "job")

        async def renewed() -> bool:
            return await lease_until(other_worker, "job") != last_renewal

        await eventually(renewed, "a lease renewal to land", timeout=5)
        release.set()
        async with asyncio.timeout(5):
            await running

        job = await queue.get("job")
    assert tries >= 10
    assert job is not None and (job.status, job.attempts, job.token) == ("done", 1, 1), pool.counters
    assert deliveries == [("job", 1, 1)]
    assert pool.counters.leases_lost == 0


async def test_a_handler_whose_lease_is_taken_away_is_cancelled_and_its_finish_never_lands(path: Path) -> None:
    pool_time, other_time = [T0], [T0]
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(body: Any, context: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with (
        await Queue.open(path, clock=lambda: pool_time[0]) as queue,
        await Queue.open(path, clock=lambda: other_time[0]) as other_worker,
    ):
        pool = Pool(queue, owner="w1", lease=1)
        pool.register("default", handler)
        await queue.enqueue("job", {})
        running = asyncio.create_task(pool.run(burst=True))
        async with asyncio.timeout(5):
            await started.wait()

        other_time[0] += 2_000  # on the other worker's clock the lease has expired: it takes the job over
        [taken] = await other_worker.claim("w2", lease=60)
        assert (taken.token, taken.fence.owner) == (2, "w2")
        pool_time[0] += 2_000  # now the pool's renewer finds the lease due, and its extend is refused

        async with asyncio.timeout(5):
            await cancelled.wait()
            await running
        job = await queue.get("job")
        assert job is not None
        assert (job.status, job.owner, job.token, job.lease_until) == ("leased", "w2", 2, taken.lease_until)
        assert pool.counters.leases_lost == 1
        assert pool.counters.finished == {}
        assert pool.counters.stale_finishes == 0
        assert await other_worker.finish(taken, "ok") == "done"


@pytest.mark.parametrize("swallows", [False, True], ids=["handler-re-raises", "handler-swallows-the-cancel"])
async def test_a_worker_whose_lease_was_lost_lives_on_and_runs_the_next_job(path: Path, swallows: bool) -> None:
    pool_time, other_time = [T0], [T0]
    started = asyncio.Event()
    ran: list[str] = []

    async def handler(body: Any, context: JobContext) -> None:
        ran.append(context.id)
        if context.id != "job":
            return
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not swallows:
                raise

    async with (
        await Queue.open(path, clock=lambda: pool_time[0]) as queue,
        await Queue.open(path, clock=lambda: other_time[0]) as other_worker,
    ):
        pool = Pool(queue, owner="w1", concurrency=1, prefetch=0, lease=1.0)  # one worker task
        pool.register("default", handler)
        await queue.enqueue("job", {})
        running = asyncio.create_task(pool.run(burst=True))
        async with asyncio.timeout(5):
            await started.wait()
        await queue.enqueue("next", {})
        other_time[0] += 2_000
        [taken] = await other_worker.claim("w2", lease=60)
        assert taken.id == "job"
        pool_time[0] += 2_000  # the renewer's extend is refused: the worker's current job is cancelled

        async with asyncio.timeout(5):
            await running
        assert ran == ["job", "next"]  # the same single worker went on to the next job
        assert pool.counters.leases_lost == 1
        assert pool.counters.finished == {"done": 1}  # "next"; the lost job's result is never written
        job, later = await queue.get("job"), await queue.get("next")
        assert job is not None and (job.status, job.owner, job.token) == ("leased", "w2", 2)
        assert later is not None and later.status == "done"


class ThreadGate:
    """A SQL function that, once armed, blocks the next call made from a thread other than the event loop's (the
    queue connection's thread, inside a write call) until released; a temporary trigger calls it on every
    update of a job row."""

    def __init__(self) -> None:
        self.armed = False
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self) -> int:
        if self.armed and threading.current_thread() is not threading.main_thread():
            self.armed = False
            self.entered.set()
            assert self.release.wait(10), "gate never released"
        return 0

    def install(self, queue: Queue) -> None:
        con = queue.store._file.conn._conn  # type: ignore[attr-defined]  # the SQLite driver's connection
        con.create_function("gate", 0, self)
        con.execute("CREATE TEMP TRIGGER gate AFTER UPDATE ON asyncq_jobs BEGIN SELECT gate(); END")


async def test_a_handler_finishing_while_its_lease_is_being_renewed_still_finishes(path: Path) -> None:
    now = [T0]
    gate = ThreadGate()
    handler = Holding()
    started, release = handler.started, handler.release

    async with await Queue.open(path, clock=lambda: now[0]) as queue:
        gate.install(queue)
        pool = Pool(queue, owner="w1", lease=1, poll_min=30, poll_max=30)  # the batcher idles on events
        pool.register("default", handler)
        await queue.enqueue("job", {})
        running = asyncio.create_task(pool.run(burst=True))
        async with asyncio.timeout(5):
            await started.wait()
        await eventually(lambda: pool.counters.commits >= 2, "the batcher to go idle")

        gate.armed = True
        now[0] += 600  # the lease is now due for renewal: the renewer's extend enters the gate
        assert await asyncio.to_thread(gate.entered.wait, 5)
        release.set()  # the handler finishes while the renewal is in flight
        await eventually(lambda: pool.running == 0, "the handler to finish")
        gate.release.set()
        async with asyncio.timeout(5):
            await running

        job = await queue.get("job")
    assert job is not None and (job.status, job.attempts) == ("done", 1), pool.counters
    assert pool.counters.stale_finishes == 0


async def test_stop_gives_back_the_jobs_claimed_ahead_so_others_take_them_at_once(queue: Queue) -> None:
    handler = Holding()
    started, release = handler.started, handler.release

    pool = Pool(queue, concurrency=1, prefetch=2)
    pool.register("default", handler)
    for job_id in ("a", "b", "c"):
        await queue.enqueue(job_id, {})
    running = asyncio.create_task(pool.run())
    async with asyncio.timeout(5):
        await started.wait()
    assert (await queue.stats()).by_status["leased"] == 3  # one running, two claimed ahead
    assert pool.running == 1
    pool.stop()
    release.set()
    async with asyncio.timeout(5):
        await running
    a, b, c = [await queue.get(job_id) for job_id in ("a", "b", "c")]
    assert a is not None and a.status == "done"
    for job in (b, c):  # pending again at once, the attempt never made not counted, the token kept
        assert job is not None and (job.status, job.attempts, job.token, job.owner) == ("pending", 0, 1, None)
    taken = await queue.claim("w2", limit=2)  # same queue time: no lease had to expire first
    assert sorted((t.id, t.token, t.attempt) for t in taken) == [("b", 2, 1), ("c", 2, 1)]


async def test_state_changes_log_at_debug_and_problems_at_warning(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(body: Any, context: JobContext) -> None:
        if body["fail"]:
            raise Permanent("bad input")

    pool = Pool(queue, concurrency=2)
    pool.register("default", handler)
    await queue.enqueue("fine", {"fail": False})
    await queue.enqueue("broken", {"fail": True})
    with caplog.at_level("DEBUG", logger="asyncq"):
        await pool.run(burst=True)
    levels = {(record.levelname, record.name) for record in caplog.records if "broken" in record.getMessage()}
    assert ("WARNING", "asyncq.worker.pool") in levels  # it failed, and it is dead: an operator must look
    fine = [record for record in caplog.records if "fine" in record.getMessage()]
    assert fine and all(record.levelname == "DEBUG" for record in fine)  # enqueued, leased, done


def _offers(path: Path) -> list[tuple[str, str, int]]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT queue, owner, slots FROM asyncq_offers ORDER BY queue").fetchall()
    finally:
        con.close()


async def test_an_idle_pool_offers_its_free_slots_and_withdraws_the_offer_when_it_stops(path: Path) -> None:
    """A running pool that finds nothing leaves an offer for each queue it serves (its free slots); a burst leaves
    none; a stopped pool's offer is gone, so another handle's enqueue then stays pending for the next pool."""
    async with await Queue.open(path) as queue, await Queue.open(path) as other:
        pool = Pool(queue, concurrency=3, owner="offering", poll_max=0.05)
        deliveries: Deliveries = []
        pool.register("mail", recording(deliveries, succeed))
        pool.register("sms", recording(deliveries, succeed))
        await pool.run(burst=True)
        assert _offers(path) == []
        running = asyncio.create_task(pool.run())
        await eventually(lambda: _offers(path) == [("mail", "offering", 3), ("sms", "offering", 3)], "the offer")
        async with other.transaction() as tx:  # leased to the pool by the enqueue itself, its attempt not counted
            await tx.enqueue("offered", {}, queue="sms")
            row = await tx.execute("SELECT status, owner, attempts FROM asyncq_jobs WHERE id = 'offered'")
        assert [tuple(found) for found in row] == [("leased", "offering", 0)]
        await eventually(lambda: _done(other, "offered"), "the offered job done")
        assert deliveries == [("offered", 1, 1)] and pool.counters.claimed == 1  # counted as its own claims are
        pool.stop()
        await running
        assert _offers(path) == []
        await other.enqueue("after", {}, queue="mail")
        job = await other.get("after")
        assert job is not None and (job.status, job.owner) == ("pending", None)


async def _done(queue: Queue, job_id: str) -> bool:
    job = await queue.get(job_id)
    return job is not None and job.status == "done" and job.attempts == 1

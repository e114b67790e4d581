"""asyncq's errors, one base for everything the library raises on purpose.

    AsyncqError
    ├── Conflict     same id, different payload (enqueue, accept, receive)
    │   └── UniqueConflict   another active job of the queue holds the unique key (``on_conflict="raise"``, redrive)
    ├── InvalidArguments   (also a ValueError) a task's arguments do not fit its signature; names each field
    ├── JobFailed    ``TaskJob.result()``: the job ended dead; carries its stored error
    ├── Retryable    a handler or transport asks for another attempt later
    ├── Permanent    a handler or transport says another attempt cannot help
    ├── SetChanged   a console's bulk action found another set than its preview showed: nothing changed
    ├── BadAck       an answer that is not evidence of completion
    │   └── Unroutable   (asyncq.delivery.amqp) the broker returned a mandatory publish: no queue took it
    └── StoreError   a store cannot be used as asked: missing, not a queue, a newer schema, read-only
        └── StoreBusy    another writer held the store's lock past the busy timeout: nothing changed, try again

A worker whose lease is taken away gets no error: the pool cancels its handler and drops its result.

Bad input is a plain ``ValueError`` raised before any change, as the lab contracts require; a busy or
locked database surfaces as ``StoreBusy`` (on SQLite also a ``sqlite3.OperationalError``) and is never turned
into "nothing to do".
"""

from __future__ import annotations


class AsyncqError(Exception):
    """Base class of every error asyncq raises on purpose."""


class Conflict(AsyncqError):
    """The id already exists with a different payload."""


class UniqueConflict(Conflict):
    """Another active (pending or leased) job of the same queue holds the unique key: nothing was inserted or
    changed. ``existing_id`` is that job's id, ``unique_key`` and ``queue`` the key and where it is held."""

    def __init__(self, unique_key: str, queue: str, existing_id: str, job_id: str | None = None) -> None:
        self.unique_key = unique_key
        self.queue = queue
        self.existing_id = existing_id
        self.job_id = job_id
        subject = "" if job_id is None else f"job {job_id!r}: "
        super().__init__(f"{subject}unique key {unique_key!r} is held by active job {existing_id!r} in queue {queue!r}")


class SetChanged(AsyncqError):
    """An operator's action found its set changed since the preview the operator confirmed (another count, or
    members in another state): nothing was changed. ``expected`` is the confirmed count, ``found`` the count now."""

    def __init__(self, expected: int, found: int) -> None:
        self.expected = expected
        self.found = found
        what = "the same count but members in another state" if expected == found else f"{found} now"
        super().__init__(f"the set changed since its preview ({expected} confirmed, {what}): nothing changed")


class InvalidArguments(AsyncqError, ValueError):
    """A task's arguments do not fit its signature: ``problems`` holds ``(field, message)`` for each bad one
    (``field`` is the parameter, with a dotted path into a model or dataclass)."""

    def __init__(self, task: str, problems: list[tuple[str, str]]) -> None:
        self.task = task
        self.problems = problems
        super().__init__(f"{task}: " + "; ".join(f"{field}: {message}" for field, message in problems))


class JobFailed(AsyncqError):
    """A task's job ended dead, so it has no result: ``job_id``, its dead ``reason`` and the newest failed
    attempt's error as stored (``error_type``, ``error_message``; ``None`` when no attempt failed)."""

    def __init__(self, job_id: str, reason: str | None, error_type: str | None, error_message: str | None) -> None:
        self.job_id = job_id
        self.reason = reason
        self.error_type = error_type
        self.error_message = error_message
        cause = f": {error_type}: {error_message}" if error_type is not None else ""
        super().__init__(f"job {job_id} ended dead ({reason}){cause}")


class Retryable(AsyncqError):
    """The attempt failed in a way another attempt may fix; the job goes back to pending."""

    def __init__(self, *args: object, delay: float | None = None, delay_ms: int | None = None) -> None:
        super().__init__(*args)
        if delay is not None and delay_ms is not None:
            raise TypeError("give delay (seconds) or delay_ms, not both")
        #: A delay the caller asks for (e.g. from ``Retry-After``), in ms; ``None`` means the policy decides.
        self.delay_ms = delay_ms if delay is None else round(delay * 1000)


class Permanent(AsyncqError):
    """The attempt failed in a way no retry can fix; the job becomes dead with reason ``permanent``."""


class BadAck(AsyncqError):
    """The receiver's answer does not prove the effect happened."""


class StoreError(AsyncqError):
    """A store cannot be used as asked: the file is missing or not a queue, its schema is newer than this
    asyncq's (or older, for a reader), or it was opened read-only. Nothing was changed."""


class StoreBusy(StoreError):
    """Another writer held the store's lock for longer than the busy timeout: the call changed nothing and may be
    tried again (a worker pool does, with backoff). On SQLite it is also a ``sqlite3.OperationalError``.

    ``may_have_landed`` is true when the connection was lost while a commit was in flight (PostgreSQL): the call
    may have changed its rows after all; a pool sends its finishes again as a resend (``Queue.commit_cycle``)."""

    may_have_landed: bool = False

"""asyncq's errors, one base for everything the library raises on purpose.

    AsyncqError
    ├── Conflict     same id, different payload (enqueue, accept, receive)
    ├── Retryable    a handler or transport asks for another attempt later
    ├── Permanent    a handler or transport says another attempt cannot help
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
    tried again (a worker pool does, with backoff). On SQLite it is also a ``sqlite3.OperationalError``."""

"""PostgreSQL's transient failures as the port's ``StoreBusy``, so that callers above the driver (a worker pool)
can tell "try again" from every other failure without knowing asyncpg.

Two kinds: the server refused or rolled back the transaction (a deadlock it broke, a serialisation failure, too
many connections, a server starting or shutting down, a server that is read-only after a failover): nothing
changed. Or the connection was lost: if that
happened while a commit was in flight, the commit may have landed; a retry is still safe, because every
finish, extend and release is fenced (a finish that had landed is refused as stale the second time).
"""

from __future__ import annotations

import asyncpg
from asyncpg import exceptions

from asyncq.errors import StoreBusy

TRANSIENT = (
    exceptions.SerializationError,
    exceptions.DeadlockDetectedError,
    exceptions.LockNotAvailableError,
    exceptions.TooManyConnectionsError,
    exceptions.AdminShutdownError,
    exceptions.CrashShutdownError,
    exceptions.CannotConnectNowError,
    exceptions.PostgresConnectionError,
    exceptions.QueryCanceledError,
    exceptions.ReadOnlySQLTransactionError,  # a standby after a failover, or default_transaction_read_only=on
)
LOST = (asyncpg.ConnectionDoesNotExistError, exceptions.ConnectionFailureError, OSError, TimeoutError)
# Everything asyncpg raises for a failed call, to catch where a connection is opened or used outside a pooled
# transaction (then told apart with ``is_lost`` and ``TRANSIENT``). ``InternalClientError`` is none of the others:
# "cannot switch to state 11/12; another operation (2) is in progress", raised on a connection whose backend was
# ended during its first statement (a pool's ``init``, a listener's ``LISTEN``), it killed chaos workers on their
# way up (benchmarks/chaos.py --store postgresql).
DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, exceptions.InternalClientError)
# What asyncpg raises on a connection a fault left unusable: closed under a transaction ("cannot call
# Transaction.__aexit__(): the underlying connection is closed"), or left in the middle of an operation by a call
# the server ended ("cannot switch to state 15; another operation (2) is in progress"). Both were seen escaping a
# pool's task group while the server was crash-restarted and its backends ended (tests/test_postgres_faults.py).
_UNUSABLE = ("connection is closed", "connection was closed", "another operation")


def is_lost(error: BaseException) -> bool:
    """Whether ``error`` means the connection or the server went away (the connection must not be used again)."""
    if isinstance(error, LOST):
        return True
    if isinstance(error, asyncpg.InterfaceError | exceptions.InternalClientError):
        return any(sign in str(error) for sign in _UNUSABLE)
    return False


class PostgresBusy(StoreBusy):
    """The server rolled the call back or could not be reached, or the connection was lost mid-call: try again."""


def as_busy(error: BaseException, location: str) -> BaseException:
    """``error`` as ``PostgresBusy`` if it is transient, else ``error`` itself."""
    if isinstance(error, PostgresBusy | exceptions.ProtocolViolationError):  # a refused startup packet stays refused
        return error
    if isinstance(error, exceptions.ReadOnlySQLTransactionError):
        return PostgresBusy(
            f"{location}: the server is read-only ({error}): a standby after a failover, or"
            " default_transaction_read_only=on; nothing changed, try again once it is writable"
        )
    # Lost before transient: asyncpg's ConnectionDoesNotExistError is a PostgresConnectionError too, and a connection
    # closed in the middle of a COMMIT may have committed (it was read as "nothing changed" before).
    if is_lost(error):
        lost = PostgresBusy(
            f"{location}: connection lost ({type(error).__name__}: {error}); a commit in flight may have landed"
        )
        lost.may_have_landed = True
        return lost
    if isinstance(error, TRANSIENT):
        return PostgresBusy(f"{location}: {type(error).__name__}: {error} (nothing changed)")
    return error

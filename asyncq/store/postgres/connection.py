"""Reaching PostgreSQL for asyncq: the URL (asyncq's own options taken out of it, and a redacted form for
messages), a pool whose every connection commits durably (``synchronous_commit`` set and checked), and
forward migrations taken under a transaction-scoped advisory lock, so that two hosts starting at once cannot
both migrate. Every component of the store (the queue, the outbox, the inbox) keeps its own version row.

asyncq's tables live in their own PostgreSQL schema (``asyncq`` unless the URL says ``?schema=…``); every
statement names them qualified, so the app's ``search_path`` is left as the app set it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from asyncq.errors import StoreError
from asyncq.store.port.queue import is_store_url
from asyncq.store.postgres.failures import DRIVER_ERRORS, TRANSIENT, PostgresBusy, is_lost

DEFAULT_SCHEMA = "asyncq"
#: How waiting workers learn of new rows: ``listen`` (LISTEN/NOTIFY, polling as the fallback) or ``poll`` only.
WAKEUPS = ("listen", "poll")
#: The connection pooler a URL goes through (``?pooler=``), by PgBouncer's pool modes: ``session`` (a client keeps
#: one server connection: LISTEN works) or ``transaction`` (each transaction may run on another: no LISTEN, no
#: prepared statement kept). Without it the URL names the server itself.
POOLERS = ("session", "transaction")
#: The URL's query options asyncq reads itself; every other one goes to asyncpg (and so to the server).
ASYNCQ_OPTIONS = ("schema", "wakeups", "pool_size", "pooler")
#: The URL's query options asyncpg takes for itself (asyncpg 0.29-0.30); it sends every other one to the server
#: as a startup setting.
ASYNCPG_OPTIONS = frozenset(
    {
        *("host", "port", "dbname", "database", "user", "password", "passfile", "service"),
        *("sslmode", "sslcert", "sslkey", "sslrootcert", "sslnegotiation", "sslcrl", "sslpassword"),
        *("ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs", "krbsrvname", "gsslib"),
    }
)
#: The startup settings PgBouncer passes on to the server; it refuses any other ("unsupported startup parameter").
POOLER_SETTINGS = frozenset(
    {"application_name", "client_encoding", "datestyle", "timezone", "standard_conforming_strings"}
)
DEFAULT_POOL_SIZE = 4
MAX_POOL_SIZE = 100
#: The commit levels at which a returned commit is on the server's disk (``off`` is not; ``local`` and the
#: remote levels are at least as strong as ``on`` on the primary).
DURABLE_COMMIT_LEVELS = ("on", "local", "remote_write", "remote_apply")

#: What asyncq's statements run on: a connection of its own pool, or the app's own (``connection=``).
Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,49}")


@dataclass(frozen=True)
class Target:
    """A parsed store URL: what asyncpg connects with, what messages show, and asyncq's own options."""

    #: The URL asyncpg is given (asyncq's options removed; the password kept).
    dsn: str
    #: The URL without its password, for messages and ``describe`` (asyncq's options kept).
    location: str
    schema: str
    wakeups: str
    pool_size: int
    #: ``session`` or ``transaction`` behind a pooler in that mode; ``None``: the server itself.
    pooler: str | None = None


def parse_url(url: object) -> Target:
    """``url`` checked and split (``ValueError`` naming what is wrong, before anything connects)."""
    if not is_store_url(url):
        raise ValueError("a PostgreSQL store is named by a postgresql:// URL")
    assert isinstance(url, str)
    if any(ch in url for ch in "\0\r\n"):
        raise ValueError("the PostgreSQL URL holds a control character")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a bad port raises here)
    except ValueError as error:
        raise ValueError(f"bad PostgreSQL URL {redact(url)}: {error}") from None
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {key: value for key, value in query if key in ASYNCQ_OPTIONS}
    if len(ours) != sum(key in ASYNCQ_OPTIONS for key, _ in query):
        raise ValueError("the PostgreSQL URL names an asyncq option twice")
    schema = check_schema(ours.get("schema", DEFAULT_SCHEMA))
    pooler = _pooler(ours.get("pooler"))
    wakeups = _wakeups(ours.get("wakeups"), pooler)
    pool_size = _pool_size(ours.get("pool_size", str(DEFAULT_POOL_SIZE)))
    rest = [(key, value) for key, value in query if key not in ASYNCQ_OPTIONS]
    if pooler is not None:
        _check_pooled_settings(key for key, _ in rest)
    dsn = urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote)))
    return Target(dsn=dsn, location=redact(url), schema=schema, wakeups=wakeups, pool_size=pool_size, pooler=pooler)


def _pooler(text: str | None) -> str | None:
    if text is not None and text not in POOLERS:
        raise ValueError(f"pooler must be one of {list(POOLERS)} (the pooler's mode), not {text!r}")
    return text


def _wakeups(text: str | None, pooler: str | None) -> str:
    """``listen`` unless the URL says ``poll``; behind a pooler in transaction mode ``poll``, and ``listen`` there is
    refused: each transaction may run on another server connection, so a LISTEN would be lost."""
    if text is not None and text not in WAKEUPS:
        raise ValueError(f"wakeups must be one of {list(WAKEUPS)}, not {text!r}")
    if pooler != "transaction":
        return text or "listen"
    if text == "listen":
        raise ValueError(
            "wakeups=listen cannot work through a pooler in transaction mode (a LISTEN stays on a server connection"
            " the pooler hands to others): leave wakeups out (the store polls), or use the pooler in session mode"
        )
    return "poll"


def _check_pooled_settings(keys: Iterable[str]) -> None:
    """Behind a pooler, a URL option asyncpg would send as a startup setting PgBouncer refuses is a ``ValueError``."""
    for key in keys:
        if key.lower() not in ASYNCPG_OPTIONS | POOLER_SETTINGS:
            raise ValueError(
                f"{key} in the URL would be a startup setting, which a pooler refuses: set it on the role or the"
                f" database instead (ALTER ROLE … SET {key} = …)"
            )


def _pool_size(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_POOL_SIZE:
        raise ValueError(f"pool_size must be a whole number from 1 to {MAX_POOL_SIZE}, not {text!r}")
    return int(text)


def check_schema(name: object) -> str:
    """A schema name asyncq may splice into its statements: lower-case letters, digits and ``_``, at most 63
    characters (PostgreSQL's 63 less room for the names asyncq derives from it), not starting with a digit or
    ``pg_``."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or name.startswith("pg_"):
        raise ValueError(
            f"schema must be lower-case letters, digits and _ (at most 50, not starting with a digit or pg_): {name!r}"
        )
    return name


def redact(url: str) -> str:
    """``url`` without its password (in the authority or as a ``password`` query option)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://…"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{userinfo.split(':', 1)[0]}@{host}"
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, quote_via=quote)))


# -- the pool -----------------------------------------------------------------------------------------------


def _open_failed(error: BaseException, target: Target) -> StoreError:
    """Why a connection could not be opened: a ``PostgresBusy`` for a server not there yet, starting, shutting down or
    full (a worker waits it out), a ``StoreError`` saying so for a pooler refusing asyncq's startup settings (the URL
    does not say ``?pooler=``), else a ``StoreError`` with the driver's message."""
    if isinstance(error, asyncpg.ProtocolViolationError):
        if "unsupported startup parameter" in str(error) and target.pooler is None:
            return StoreError(
                f"cannot open {target.location}: {error}: a connection pooler (PgBouncer?) answers at this address;"
                " say how it pools: add ?pooler=session (LISTEN/NOTIFY wake-ups) or ?pooler=transaction (woken by"
                " polling) to the URL"
            )
        return StoreError(f"cannot open {target.location}: {error}")
    if isinstance(error, TRANSIENT) or is_lost(error):
        return PostgresBusy(f"cannot open {target.location} now: {type(error).__name__}: {error}")
    return StoreError(f"cannot open {target.location}: {error}")


def _server_settings(target: Target, read_only: bool) -> dict[str, str]:
    """The settings a connection starts with. Behind a pooler (``?pooler=``) only ``application_name``: PgBouncer
    refuses any other startup parameter ("unsupported startup parameter"), in either mode; ``synchronous_commit``
    is still read back on every connection (``_check_durable``), and a read-only handle refuses writes before any
    statement and reads in read-only transactions."""
    if target.pooler is not None:
        return {"application_name": "asyncq"}
    settings = {"synchronous_commit": "on", "application_name": "asyncq"}
    return settings | {"default_transaction_read_only": "on"} if read_only else settings


async def open_pool(target: Target, *, size: int | None = None, read_only: bool = False) -> asyncpg.Pool:
    """A pool of up to ``size`` connections (the URL's ``pool_size`` by default), each started with
    ``synchronous_commit=on``; the setting is read back on every new connection (a pooler may drop startup
    settings), and a level at which a commit is not on disk is a ``StoreError``."""
    try:
        pool = await asyncpg.create_pool(
            target.dsn,
            min_size=1,
            max_size=size or target.pool_size,
            server_settings=_server_settings(target, read_only),
            init=_check_durable,
            statement_cache_size=statement_cache_size(target),
        )
    except DRIVER_ERRORS as error:
        raise _open_failed(error, target) from error
    assert pool is not None
    return pool


def statement_cache_size(target: Target) -> int:
    """asyncpg prepares and caches statements per connection; none survives a pooler in transaction mode."""
    return 0 if target.pooler == "transaction" else 100


async def _check_durable(conn: Connection) -> None:
    level = await conn.fetchval("SHOW synchronous_commit")
    if level not in DURABLE_COMMIT_LEVELS:
        raise StoreError(f"synchronous_commit is {level!r} on this connection: a commit would not survive power loss")


async def connect(target: Target, *, read_only: bool = False) -> asyncpg.Connection:
    """One connection with the pool's settings (for a listener, or a short operator's read)."""
    try:
        conn = await asyncpg.connect(
            target.dsn,
            server_settings=_server_settings(target, read_only),
            statement_cache_size=statement_cache_size(target),
        )
    except DRIVER_ERRORS as error:
        raise _open_failed(error, target) from error
    try:
        await _check_durable(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


# -- migrations ---------------------------------------------------------------------------------------------

#: Each component's schema version: one row per component (``queue``, ``outbox``, ``inbox``…).
VERSIONS_TABLE = "CREATE TABLE IF NOT EXISTS {schema}.versions (component text PRIMARY KEY, version integer NOT NULL)"


@dataclass(frozen=True)
class Migrations:
    """A component's forward migrations: step ``n`` (0-based) moves it from version ``n`` to ``n + 1``. Each
    statement may name ``{schema}``. Append only; never edit a step that has shipped."""

    component: str
    steps: tuple[tuple[str, ...], ...]

    @property
    def version(self) -> int:
        """The version this asyncq brings the component to."""
        return len(self.steps)


def advisory_key(schema: str) -> int:
    """The advisory lock every migration of ``schema`` takes: a stable signed 64-bit number of its name."""
    digest = hashlib.blake2b(f"asyncq-migrate:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def migrate(conn: Connection, schema: str, migrations: Migrations) -> int:
    """Bring ``migrations.component`` in ``schema`` to its version, in one transaction under
    ``pg_advisory_xact_lock`` (a second host waits, then finds the work done); returns the version found. A
    newer version is a ``StoreError`` with nothing changed; a failed step rolls every step back."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", advisory_key(schema))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(VERSIONS_TABLE.format(schema=schema))
        found = await conn.fetchval(f"SELECT version FROM {schema}.versions WHERE component = $1", migrations.component)
        found = 0 if found is None else int(found)
        if found > migrations.version:
            raise StoreError(
                f"schema {schema} has {migrations.component} version {found}, newer than this asyncq's "
                f"({migrations.version})"
            )
        for step in migrations.steps[found:]:
            for statement in step:
                await conn.execute(statement.format(schema=schema))
        if found != migrations.version:
            await conn.execute(
                f"INSERT INTO {schema}.versions (component, version) VALUES ($1, $2)"
                " ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
                migrations.component,
                migrations.version,
            )
    return found


async def read_version(conn: Connection, schema: str, component: str) -> int | None:
    """``component``'s version in ``schema`` without creating or changing anything: ``None`` if the schema
    has no version table, ``0`` if it has one without that component."""
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{schema}.versions")
    if not exists:
        return None
    found = await conn.fetchval(f"SELECT version FROM {schema}.versions WHERE component = $1", component)
    return 0 if found is None else int(found)


async def schema_exists(conn: Connection, schema: str) -> bool:
    """Whether the database has a schema of that name."""
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema))


async def settings(conn: Connection, names: Sequence[str]) -> dict[str, Any]:
    """The server's current value of each setting in ``names`` (for ``describe``)."""
    rows = await conn.fetch("SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])", list(names))
    return {row["name"]: row["setting"] for row in rows}

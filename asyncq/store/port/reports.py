"""What a store's operator calls report: ``prune``, ``backup`` and ``describe``. Dictionaries at run time (the CLI
prints them as JSON as they are), typed here so that a caller's ``report["deleted"]`` is checked."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class PruneReport(TypedDict):
    """What ``prune`` did."""

    deleted: int  #: jobs deleted (their audit rows stay)
    #: how the space went back: SQLite ``incremental`` / ``full`` / ``skipped``; PostgreSQL ``autovacuum``
    vacuum: Literal["incremental", "full", "skipped", "autovacuum"]
    free_pages: int | None  #: SQLite's free pages after the prune (``None`` on PostgreSQL)
    bytes_before: int  #: the file's (SQLite) or the jobs table's (PostgreSQL) size before
    bytes_after: int  #: the same size after
    batches: NotRequired[int]  #: PostgreSQL: the short transactions it took


class BackupReport(TypedDict):
    """What ``backup`` wrote: the checked copy."""

    path: str
    bytes: int
    pages: int
    page_size: int
    check: str  #: SQLite's ``quick_check`` of the copy: always ``ok`` (damage raises)
    jobs: dict[str, int]  #: the copy's jobs by status


class StoreDescription(TypedDict):
    """What a store is, for an operator."""

    store: Literal["sqlite", "postgresql"]
    path: str  #: the file, or the URL with its password redacted
    schema_version: int
    survives_power_loss: bool  #: whether a returned call survives power loss at the level it was opened at
    durability: NotRequired[str]  #: SQLite: the durability level (``full``, ``full-delete``, ``normal`` …)
    journal_mode: NotRequired[str]  #: SQLite
    auto_vacuum: NotRequired[str]  #: SQLite
    schema: NotRequired[str]  #: PostgreSQL: the schema the tables live in
    wakeups: NotRequired[str]  #: PostgreSQL: ``listen`` or ``poll``
    settings: NotRequired[dict[str, str]]  #: PostgreSQL: the server settings asyncq depends on

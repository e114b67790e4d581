"""The transactional outbox and its ordered relay (``docs/outbox.md``); statements in ``asyncq.store.sqlite.outbox``."""

from asyncq.outbox.relay import (
    AuditEntry,
    Figures,
    Item,
    Outbox,
    OutboxTransaction,
    ReceiverFigures,
    Relay,
    RelayResult,
    add_sync,
    receiver_figures,
)

__all__ = [
    "AuditEntry",
    "Figures",
    "Item",
    "Outbox",
    "OutboxTransaction",
    "ReceiverFigures",
    "Relay",
    "RelayResult",
    "add_sync",
    "receiver_figures",
]

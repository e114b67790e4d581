"""The transactional outbox and its ordered relay (``docs/outbox.md``), over the outbox store's port
(``asyncq.store.port.outbox``; the drivers are ``asyncq.store.sqlite.outbox`` and, for a ``postgresql://``
URL, ``asyncq.store.postgres.outbox``). SQLite's ``add_sync`` is in ``asyncq.sqlite``."""

from asyncq.outbox.outbox import Outbox, OutboxTransaction, receiver_figures
from asyncq.outbox.relay import Relay, RelayResult
from asyncq.store.port.outbox import Figures, Item, OutboxAuditEntry, ReceiverFigures

__all__ = [
    "Figures",
    "Item",
    "Outbox",
    "OutboxAuditEntry",
    "OutboxTransaction",
    "ReceiverFigures",
    "Relay",
    "RelayResult",
    "receiver_figures",
]

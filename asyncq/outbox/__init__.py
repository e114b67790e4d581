"""The transactional outbox and its ordered relay (``docs/outbox.md``), over the outbox store's port
(``asyncq.store.port.outbox``; the drivers are ``asyncq.store.sqlite.outbox`` and, for a ``postgresql://``
URL, ``asyncq.store.postgres.outbox``)."""

from asyncq.outbox.outbox import Outbox, OutboxTransaction, receiver_figures
from asyncq.outbox.relay import Relay, RelayResult
from asyncq.store.port.outbox import AuditEntry, Figures, Item, ReceiverFigures

# SQLite's own helper: it joins the transaction of the app's ``sqlite3`` connection, so it is the driver's.
from asyncq.store.sqlite.outbox import add_sync

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

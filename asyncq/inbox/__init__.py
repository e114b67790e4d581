"""The receiving side: an aiohttp endpoint that applies each event's effect once, with its inbox row.

``asyncq.inbox.receiver`` holds the facade and the HTTP handling, over the inbox store's port
(``asyncq.store.port.inbox``; the drivers are ``asyncq.store.sqlite.inbox`` and, for a ``postgresql://`` db,
``asyncq.store.postgres.inbox``). An effect is written against
``EffectTransaction``; ``add_to_stock`` is the example. ``python -m asyncq.inbox`` runs a receiver standalone.
"""

from asyncq.inbox.receiver import (
    INBOX_KEY,
    Inbox,
    InboxCounters,
    inbox_lifecycle,
    inbox_routes,
    main,
    make_inbox_app,
    parse_event,
    spawn,
)
from asyncq.inbox.stock import STOCK_TABLES, add_to_stock
from asyncq.store.port.effects import EffectTransaction
from asyncq.store.port.inbox import InboxEffect as Effect

__all__ = [
    "INBOX_KEY",
    "STOCK_TABLES",
    "Effect",
    "EffectTransaction",
    "Inbox",
    "InboxCounters",
    "add_to_stock",
    "inbox_lifecycle",
    "inbox_routes",
    "main",
    "make_inbox_app",
    "parse_event",
    "spawn",
]

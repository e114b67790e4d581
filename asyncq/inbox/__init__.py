"""The receiving side: an aiohttp endpoint that applies each event's effect once, with its inbox row.

``asyncq.inbox.receiver`` holds the facade and the HTTP handling; the SQLite statements are the driver's
(``asyncq.store.sqlite.inbox``). ``python -m asyncq.inbox`` runs a receiver standalone.
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

__all__ = [
    "INBOX_KEY",
    "Inbox",
    "InboxCounters",
    "inbox_lifecycle",
    "inbox_routes",
    "main",
    "make_inbox_app",
    "parse_event",
    "spawn",
]

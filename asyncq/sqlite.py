"""SQLite's own public helpers: each joins the transaction an app's ``sqlite3`` connection has open (or opens and
commits its own), so it is the SQLite driver's by nature and has no PostgreSQL counterpart.

- ``enqueue_sync(con, job_id, body, …)``: a job (also ``asyncq.enqueue_sync``; ``Task.defer_sync`` uses it);
- ``add_sync(con, item_id, body, …)``: an outbox event (``docs/outbox.md``);
- ``process_delivery(con, delivery, effect, …)``: the AMQP consumer's rule for one delivery (``asyncq.amqp``).

Importing this module loads the SQLite driver; ``asyncq.outbox``, ``asyncq.amqp`` and ``asyncq.tasks`` do not.
"""

from asyncq.store.sqlite.amqp import process_delivery
from asyncq.store.sqlite.outbox import add_sync
from asyncq.store.sqlite.sync import enqueue_sync

__all__ = ["add_sync", "enqueue_sync", "process_delivery"]

"""``Queue``: the async facade over a queue store. It checks every argument, reads the injected clock, and hands
the store (``asyncq.store.port.QueueStore``) only checked values and ``now``.

The facade is one class, ``Queue`` (``facade.py``: opening, producers, transactions), assembled from the calls of
each role: a worker's (``working.py``), an operator's (``operators.py``) and the readers' (``reads.py``).
"""

from asyncq.queue.facade import Queue, QueueOptions, Transaction
from asyncq.queue.reads import Prunable
from asyncq.queue.working import Attempt, Claimed, Renewed

__all__ = ["Attempt", "Claimed", "Prunable", "Queue", "QueueOptions", "Renewed", "Transaction"]

"""The store port: every operation the layers above a store use, as ``typing.Protocol``s.

A store is a driver that implements these (``asyncq.store.sqlite`` today); ``asyncq.store.opening`` picks one
from what the caller names (a path means SQLite). ``tests/store/`` is the conformance suite every driver passes.
"""

from asyncq.store.port.queue import Capabilities, JobFilter, QueueStore, StoreTransaction

__all__ = ["Capabilities", "JobFilter", "QueueStore", "StoreTransaction"]

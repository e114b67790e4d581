"""The store port: every operation the layers above a store use, as ``typing.Protocol``s.

A store is a driver that implements these (``asyncq.store.sqlite`` and ``asyncq.store.postgres``);
``asyncq.store.opening`` picks one from what the caller names (a ``postgresql://`` URL, or a path to a SQLite
file). ``tests/conformance/`` is the conformance suite every driver passes.
The inbox, outbox and AMQP consumer have ports of their own (``inbox``, ``outbox``, ``amqp``); a user's effect
is written against ``effects.EffectTransaction``, never a driver's connection.
"""

from asyncq.store.port.amqp import AmqpStore
from asyncq.store.port.effects import EffectTransaction
from asyncq.store.port.inbox import InboxEffect, InboxEvent, InboxStore, InboxTotals
from asyncq.store.port.outbox import OutboxStore, OutboxStoreTransaction
from asyncq.store.port.queue import Capabilities, JobFilter, QueueStore, StoreTransaction

__all__ = [
    "AmqpStore",
    "Capabilities",
    "EffectTransaction",
    "InboxEffect",
    "InboxEvent",
    "InboxStore",
    "InboxTotals",
    "JobFilter",
    "OutboxStore",
    "OutboxStoreTransaction",
    "QueueStore",
    "StoreTransaction",
]

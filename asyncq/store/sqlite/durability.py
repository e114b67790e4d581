"""Durability levels of a product queue file, stated once.

"Fully durable" means a change survives power loss once the call returns. In WAL mode ``FULL`` syncs
the log at every commit; in DELETE mode only ``EXTRA`` also syncs the directory after the rollback
journal is deleted (``FULL`` can lose the last commit on power loss). ``NORMAL`` in WAL survives a
process crash but may lose the last transactions on power loss: faster, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Durability:
    """A journal mode and synchronous level, and whether commits survive power loss."""

    name: str
    journal_mode: str
    synchronous: str
    survives_power_loss: bool


FULL = Durability("full", "WAL", "FULL", True)
FULL_DELETE = Durability("full-delete", "DELETE", "EXTRA", True)
NORMAL = Durability("normal", "WAL", "NORMAL", False)
LEVELS = {level.name: level for level in (FULL, FULL_DELETE, NORMAL)}
DEFAULT = FULL

"""Where the ticket desk finds RabbitMQ, its queue and its store: the environment, else this machine's defaults.

AMQP_URL                     amqp://guest:guest@127.0.0.1:5672/
TICKET_DESK_QUEUE            nightjar.registrations (a durable queue)
TICKET_DESK_QUEUE_EXPIRES_MS unset; tests set it so that their queues delete themselves when unused
TICKET_DESK_DB               nightjar.db in this folder
TICKET_DESK_HANDLER          handler (the module worker.py calls; e.g. handler_no_key)
TICKET_DESK_BUSY_TIMEOUT     10 (seconds a write waits for another writer; read by store.py)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Settings:
    """One process's view of the environment."""

    amqp_url: str
    queue: str
    queue_expires_ms: int | None
    db_path: Path
    handler: str

    @classmethod
    def from_env(cls) -> Settings:
        """Read the environment once."""
        expires = os.environ.get("TICKET_DESK_QUEUE_EXPIRES_MS")
        return cls(
            amqp_url=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
            queue=os.environ.get("TICKET_DESK_QUEUE", "nightjar.registrations"),
            queue_expires_ms=int(expires) if expires else None,
            db_path=Path(os.environ.get("TICKET_DESK_DB", HERE / "nightjar.db")),
            handler=os.environ.get("TICKET_DESK_HANDLER", "handler"),
        )

    @property
    def queue_arguments(self) -> dict[str, Any]:
        """The arguments every declare of the queue uses (RabbitMQ refuses a declare with others)."""
        return {} if self.queue_expires_ms is None else {"x-expires": self.queue_expires_ms}

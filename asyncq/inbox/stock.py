"""The example effect: what ``python -m asyncq.inbox --effect stock`` and the examples apply for each event."""

from __future__ import annotations

from typing import Any

from asyncq.core.values import check_identifier, check_int
from asyncq.errors import Permanent
from asyncq.store.port.effects import EffectTransaction

#: The example effect's table, created with the inbox's own.
STOCK_TABLES = ("CREATE TABLE IF NOT EXISTS stock (item TEXT PRIMARY KEY, qty INTEGER NOT NULL)",)

ADD_TO_STOCK = "INSERT INTO stock (item, qty) VALUES (?, ?) ON CONFLICT(item) DO UPDATE SET qty = qty + excluded.qty"


def add_to_stock(tx: EffectTransaction, event_id: str, body: Any) -> None:
    """Example effect: add the body's ``qty`` (int 1-1000) to the ``stock`` row of its ``item`` (default
    ``snack``). A body without a valid ``qty`` is ``Permanent``: no retry can fix it."""
    try:
        if type(body) is not dict:
            raise ValueError("body must be a JSON object")
        qty = check_int(body.get("qty"), "qty", 1, 1000)
        item = check_identifier(body.get("item", "snack"), "item")
    except ValueError as exc:
        raise Permanent(str(exc)) from None
    tx.execute(ADD_TO_STOCK, (item, qty))

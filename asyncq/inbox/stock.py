"""The example effect: what ``python -m asyncq.inbox --effect stock`` and the examples apply for each event."""

from __future__ import annotations

from typing import Any

from asyncq.core.values import check_identifier, check_int
from asyncq.errors import Permanent
from asyncq.store.port.effects import EffectTransaction

#: The example effect's table, created with the inbox's own (the same text for both stores; on PostgreSQL in the
#: connection's ``search_path``).
STOCK_TABLES = ("CREATE TABLE IF NOT EXISTS stock (item TEXT PRIMARY KEY, qty INTEGER NOT NULL)",)

_UPSERT = "INSERT INTO stock (item, qty) VALUES ({}) ON CONFLICT (item) DO UPDATE SET qty = stock.qty + excluded.qty"
#: The effect's statement in each store's dialect (``EffectTransaction.dialect``).
ADD_TO_STOCK = {"sqlite": _UPSERT.format("?, ?"), "postgresql": _UPSERT.format("$1, $2")}


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
    tx.execute(ADD_TO_STOCK[tx.dialect], (item, qty))

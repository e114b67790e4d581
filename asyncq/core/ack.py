"""What counts as an acknowledgement: the one rule every sender applies to a receiver's answer body.

An ACK is strict UTF-8 JSON for an object whose ``id`` is exactly the id that was sent (and, where the
receiver states one, whose ``status`` is among the accepted ones). Anything else is ``BadAck``: an answer,
but not evidence that the effect happened.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from asyncq.core.jsontext import loads_strict
from asyncq.errors import BadAck


def verify_ack(sent_id: str, raw: bytes, statuses: Collection[str] | None = None) -> dict[str, Any]:
    """The ACK object if ``raw`` acknowledges ``sent_id`` (with a ``status`` in ``statuses``, if given)."""
    try:
        ack = loads_strict(raw)
    except ValueError as error:
        raise BadAck(f"the answer is not strict UTF-8 JSON: {error}") from None
    if type(ack) is not dict:
        raise BadAck(f"the answer is a JSON {type(ack).__name__}, not an object")
    if type(ack.get("id")) is not str or ack["id"] != sent_id:
        raise BadAck(f"the answer acknowledges id {ack.get('id')!r}, not {sent_id!r}")
    if statuses is not None and (type(ack.get("status")) is not str or ack["status"] not in statuses):
        raise BadAck(f"the answer's status {ack.get('status')!r} is not one of {sorted(statuses)}")
    return ack

"""The transport interface the worker pool delivers through, and the one JSON encoding every transport uses.

A transport has one job: hand a job's body to its receiver and return only once the receiver has proved it
took the job. Everything else is an error from :mod:`asyncq.errors`:

* ``Retryable(delay_ms=…)``: another attempt may succeed (busy receiver, timeout, broken connection);
* ``Permanent``: no attempt can succeed (the receiver refuses this job, or the body cannot be encoded);
* ``BadAck``: an answer came but it is not evidence of completion; the pool retries it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Protocol, TypeAlias

from asyncq.core.jsontext import JSONInput
from asyncq.errors import Permanent

#: What a job's body may be: anything that encodes as strict JSON (``asyncq.core.jsontext.JSONInput``).
Body: TypeAlias = JSONInput


class JsonText(str):
    """A body that is already JSON text, such as a stored job's canonical body: transports send it as it
    is instead of encoding it again (a ``str`` that is not a ``JsonText`` is sent as a JSON string)."""


class Transport(Protocol):
    """Delivers one job at a time; one instance is shared by all of a pool's workers."""

    async def deliver(self, job_id: str, body: Body, headers: Mapping[str, str]) -> None:
        """Return only on a verified acknowledgement of ``job_id``; otherwise raise ``Retryable``,
        ``Permanent`` or ``BadAck`` (``ValueError`` for arguments that are not valid at all)."""
        ...

    async def close(self) -> None:
        """Release connections; the transport is not used again."""
        ...


_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)  # built once, not per call


def encode_body(body: object) -> bytes:
    """``body`` as compact UTF-8 JSON; ``Permanent`` if it is not strict JSON (NaN, a set, a cycle …),
    because no retry can make it encodable. A ``JsonText`` is sent as it is."""
    if type(body) is JsonText:
        return body.encode("utf-8")
    try:
        return _COMPACT.encode(body).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError (lone surrogate) is a ValueError
        raise Permanent(f"job body is not JSON: {exc}") from exc

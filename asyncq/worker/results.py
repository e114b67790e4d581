"""A handler's return value as it is kept with its job: canonical JSON within a body's limit, stored by the commit of
the finish that ends the job ``done`` (a worker whose lease was lost never writes one), kept ``result_ttl`` seconds
(then ``prune`` removes it), read with ``Queue.get(id).result``. A task's result (``asyncq.tasks``) is validated by
its annotation first, then kept the same way."""

from __future__ import annotations

from asyncq.core.jobs import StoredResult, body_text
from asyncq.errors import Permanent

#: How long a result is kept by default (seconds): a week.
DEFAULT_RESULT_TTL = 7 * 86_400.0
#: The longest a result may be kept (seconds): ten years.
MAX_RESULT_TTL = 3650 * 86_400.0


def kept_result(value: object, keep_ms: int, whose: str = "the handler's") -> StoredResult:
    """``value`` as it is kept for ``keep_ms`` ms; a value that is not JSON, or too large, is ``Permanent`` (the
    handler's effect happened: running it again cannot make its return value storable)."""
    try:
        text = body_text(value)  # a body's rule: canonical JSON within MAX_BODY_BYTES
    except ValueError as error:
        raise Permanent(f"{whose} return value cannot be kept: {error}") from error
    return StoredResult(text, keep_ms)

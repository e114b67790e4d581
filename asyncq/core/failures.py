"""The one rule that turns a failed attempt into an outcome and a delay, and what is kept of its error.

The pool (a handler's exception, a transport's ``BadAck``), the outbox relay and the AMQP consumer call
``classify``: ``Permanent`` is ``permanent`` (no retry can help); anything else is ``retry``, after the policy's
backoff, or after the delay a ``Retryable(delay_ms=…)`` asks for (capped by the policy).

The lease lab's ``run_once`` differs on purpose: its contract classifies only ``Retryable`` and ``Permanent`` and
lets every other error (and ``BadAck``) propagate with the job still leased, because the lab's caller decides
what an unexpected error means; a product worker must never stop on one, so it retries it within the budget.
"""

from __future__ import annotations

import traceback
from typing import NamedTuple

from asyncq.core.backoff import RetryPolicy
from asyncq.core.lifecycle import PERMANENT, RETRY, OutcomeName
from asyncq.errors import Permanent

#: How much of a traceback is kept with a failed attempt (the end of it: the frames nearest the failure).
TRACEBACK_MAX_CHARS = 4096
MESSAGE_MAX_CHARS = 1024


class Verdict(NamedTuple):
    """What a failed attempt leads to: ``outcome`` (``retry`` or ``permanent``) and ``delay_ms`` before the next."""

    outcome: OutcomeName
    delay_ms: int


class ErrorText(NamedTuple):
    """An error as it is stored: its type's name, its message and its traceback, each cut to a bound."""

    type: str
    message: str
    traceback: str


def classify(error: BaseException, attempt: int, policy: RetryPolicy) -> Verdict:
    """The outcome of an attempt (``attempt``, 1 …) that raised ``error``."""
    if isinstance(error, Permanent):
        return Verdict(PERMANENT, 0)
    return Verdict(RETRY, policy.delay_ms(attempt, error))


def error_text(error: BaseException) -> ErrorText:
    """What is kept of ``error``: ``module.Type`` (builtins without a module), the message, the traceback's end."""
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(error))
    return ErrorText(name, str(error)[:MESSAGE_MAX_CHARS], text[-TRACEBACK_MAX_CHARS:])

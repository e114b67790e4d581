"""Exact value checks shared by every entry point (lab shims, the async facade, the CLI).

Every check raises ``ValueError`` naming the parameter, and never converts: ``True`` is not an int,
a ``dict`` subclass is not a dict, ``"a\\n"`` is not an identifier.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from enum import StrEnum
from typing import Any

from asyncq.core.limits import (
    MAX_LIMIT_KEY_CHARS,
    MAX_NOTE_CHARS,
    MAX_PRIORITY,
    MAX_TASK_NAME_CHARS,
    MAX_UNIQUE_KEY_CHARS,
    MIN_PRIORITY,
)

IDENTIFIER_MAX = 64
TIME_MAX_MS = 10**15 - 60_000
TOKEN_MAX = 10**15

# An explicit ASCII class with fullmatch: `\w` would admit Unicode letters and `$` a trailing newline.
_IDENTIFIER = re.compile(rf"[A-Za-z0-9_-]{{1,{IDENTIFIER_MAX}}}")


def check_identifier(value: object, name: str) -> str:
    """Return ``value`` if it is an exact ``str`` of 1-64 ASCII letters, digits, ``_`` or ``-``."""
    if type(value) is not str or _IDENTIFIER.fullmatch(value) is None:
        raise ValueError(f"{name} must be a str of 1-{IDENTIFIER_MAX} ASCII letters, digits, '_' or '-'")
    return value


def check_note(value: object, name: str = "note") -> str:
    """Return ``value`` if it is an operator's note: an exact ``str`` of 1-500 printable characters (any
    script; no control characters, no line breaks), not starting or ending with whitespace."""
    if type(value) is not str:
        raise ValueError(f"{name} must be a str, not {type(value).__name__}")
    return _printable_text(value, name, MAX_NOTE_CHARS)


def check_text(value: object, name: str, most: int) -> str:
    """Return ``value`` if it is an exact ``str`` of 1-``most`` printable characters (a note's rule, another length)."""
    if type(value) is not str:
        raise ValueError(f"{name} must be a str, not {type(value).__name__}")
    return _printable_text(value, name, most)


def _printable_text(value: str, name: str, most: int) -> str:
    """``value`` if it is 1-``most`` printable characters (no control characters, no line breaks), not starting or
    ending with whitespace: an operator's note and a unique key alike."""
    if not 1 <= len(value) <= most or not value.isprintable() or value.strip() != value:
        raise ValueError(
            f"{name} must be 1-{most} printable characters with no control characters"
            " and no leading or trailing whitespace"
        )
    return value


def check_priority(value: object, name: str = "priority") -> int:
    """A job's priority: an exact ``int`` (never ``bool``; ``TypeError`` otherwise) in -100 … 100, higher first
    (``ValueError`` outside)."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int from {MIN_PRIORITY} to {MAX_PRIORITY}, not {type(value).__name__}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{name} must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {value}")
    return value


def check_unique_key(value: object, name: str = "unique_key") -> str | None:
    """A job's unique key: ``None`` (none) or an exact ``str`` (``TypeError`` otherwise) of 1-200 printable
    characters (any script; no control characters or line breaks) that does not start or end with whitespace
    (``ValueError`` otherwise)."""
    if value is None:
        return None
    if type(value) is not str:
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")
    return _printable_text(value, name, MAX_UNIQUE_KEY_CHARS)


def check_limit_key(value: object, name: str = "limit_key") -> str | None:
    """A job's limit key (whose jobs a queue's per-key concurrency limit bounds together: a tenant, an account):
    ``None`` (none) or an exact ``str`` (``TypeError`` otherwise) of 1-200 printable characters without leading or
    trailing whitespace (``ValueError`` otherwise), the rule of a unique key."""
    if value is None:
        return None
    if type(value) is not str:
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")
    return _printable_text(value, name, MAX_LIMIT_KEY_CHARS)


def check_task_name(value: object, name: str = "task") -> str:
    """A task's name: an exact ``str`` (``TypeError`` otherwise) of 1-200 printable characters (any script) that does
    not start or end with whitespace (``ValueError`` otherwise): what a job's ``task`` column holds."""
    if type(value) is not str:
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return _printable_text(value, name, MAX_TASK_NAME_CHARS)


def is_task_name(value: str) -> bool:
    """Whether ``value`` passes ``check_task_name`` (for a body's name, read without raising)."""
    return 1 <= len(value) <= MAX_TASK_NAME_CHARS and value.isprintable() and value.strip() == value


#: What a second job with a unique key held by an active job does: ``return`` (the default) inserts nothing and
#: answers with the id of the job that holds the key; ``raise`` raises ``asyncq.UniqueConflict`` (nothing inserted).
ON_CONFLICT = ("return", "raise")


def check_on_conflict(value: object, name: str = "on_conflict") -> str:
    """``return`` or ``raise`` (``ON_CONFLICT``); ``ValueError`` otherwise."""
    if type(value) is not str or value not in ON_CONFLICT:
        raise ValueError(f"{name} must be one of {list(ON_CONFLICT)}, not {value!r}")
    return value


def check_int(value: object, name: str, low: int, high: int) -> int:
    """Return ``value`` if it is an exact ``int`` (never ``bool``) with ``low <= value <= high``."""
    if type(value) is not int:
        raise ValueError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def check_flag(value: object, name: str) -> bool:
    """Return ``value`` if it is an exact ``bool`` (``TypeError`` otherwise: ``1`` or ``"yes"`` is not a flag)."""
    if type(value) is not bool:
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def check_time(value: object, name: str = "now_ms") -> int:
    """A millisecond timestamp on the queue's shared time base: an exact int in 0 … 10**15 - 60000."""
    return check_int(value, name, 0, TIME_MAX_MS)


def check_ratio(value: object, name: str) -> float | int:
    """An exact ``int`` or ``float`` (no bool, no subclass), finite, in 0 … 1."""
    if type(value) not in (int, float):
        raise ValueError(f"{name} must be an int or float, not {type(value).__name__}")
    assert isinstance(value, int | float)
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be finite and between 0 and 1, got {value!r}")
    return value


def check_exact_dict(value: object, name: str, keys: Collection[str]) -> dict[str, Any]:
    """Return ``value`` if it is an exact ``dict`` whose keys are exactly ``keys``."""
    if type(value) is not dict:
        raise ValueError(f"{name} must be a dict, not {type(value).__name__}")
    if len(value) != len(keys) or set(value) != set(keys):
        raise ValueError(f"{name} must have exactly the keys {sorted(keys)}")
    return value


def check_choice(value: object, name: str, choices: Collection[str]) -> str:
    """Return ``value`` if it is an exact ``str`` (or a member of one of asyncq's ``StrEnum``s) among ``choices``."""
    if (type(value) is not str and not isinstance(value, StrEnum)) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(map(str, choices))}")
    return value


def check_hook(value: object, name: str = "fault") -> Callable[[str], object] | None:
    """``None`` (no hook) or a callable taking the fault point's name."""
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be None or callable")
    return value


def check_event(event: object, name: str = "event") -> dict[str, Any]:
    """The labs' event: an exact dict with only ``id`` (identifier) and ``qty`` (int 1-1000); a new dict."""
    checked = check_exact_dict(event, name, ("id", "qty"))
    return {
        "id": check_identifier(checked["id"], f"{name}['id']"),
        "qty": check_int(checked["qty"], f"{name}['qty']", 1, 1000),
    }


def snapshot(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy: what a callback receives so that it cannot change the caller's record."""
    return dict(mapping)


def check_seconds(value: object, name: str) -> float:
    """A duration in seconds: a positive, finite, exact ``int`` or ``float`` (no bool, no subclass)."""
    if type(value) not in (int, float):
        raise ValueError(f"{name} must be an int or float, not {type(value).__name__}")
    assert isinstance(value, int | float)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return float(value)


def check_duration(value: object, name: str, low: float, high: float) -> float:
    """A duration in seconds in ``low`` … ``high`` (zero allowed if ``low`` is): an exact, finite ``int`` or
    ``float`` (no bool), or a ``datetime.timedelta``."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if type(value) not in (int, float):
        raise ValueError(f"{name} must be seconds as an int or float, not {type(value).__name__}")
    assert isinstance(value, int | float)
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high} seconds, got {value!r}")
    return float(value)


#: A duration on the public API: seconds (``int`` or ``float``) or a ``datetime.timedelta``.
Duration = int | float | timedelta


def duration_ms(value: object, name: str, default_ms: int, low_ms: int, high_ms: int) -> int:
    """Milliseconds from a duration given in seconds as ``name`` (or a ``timedelta``); ``default_ms`` when it is
    ``None``."""
    if value is None:
        return default_ms
    seconds = check_duration(value, name, low_ms / 1000, high_ms / 1000)
    return check_int(round(seconds * 1000), name + " in ms", low_ms, high_ms)

"""The ``asyncq`` command's argument types. A bad value is a usage error (exit status 2) found while parsing,
before anything is opened; every range is the library's own, from its named limits, so that a value the parser
accepts is one the library accepts."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from asyncq.core.groups import check_group_name
from asyncq.core.jsontext import loads_strict
from asyncq.core.values import check_identifier, check_note, check_task_name

_DURATION = re.compile(r"([0-9]{1,9})(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"[0-9]{1,30}")
_SIGNED = re.compile(r"-?[0-9]{1,30}")
_UNIT_MS = {"w": 604_800_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
MAX_PORT = 65_535


class Missing:
    """The default of an optional positional that was not given (``null`` is a JSON value, so not ``None``)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = Missing()


def identifier(text: str) -> str:
    """A job id, queue or owner name: 1-64 ASCII letters, digits, ``_`` or ``-``."""
    try:
        return check_identifier(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 1-64 ASCII letters, digits, '_' or '-'") from None


def task_name(text: str) -> str:
    """A task's name: 1-200 printable characters (``core.values.check_task_name``)."""
    try:
        return check_task_name(text, "task")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def group_name(text: str) -> str:
    """A group's name: 1-58 ASCII letters, digits, ``_`` or ``-`` (``core.groups.check_group_name``)."""
    try:
        return check_group_name(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not 1-58 ASCII letters, digits, '_' or '-'") from None


def note(text: str) -> str:
    """An operator's note: 1-500 printable characters (``core.values.check_note``)."""
    try:
        return check_note(text, "note")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shown_ms(ms: int) -> str:
    """A duration in its largest whole unit: ``365d``, ``90s``, ``1ms``."""
    for unit, size in _UNIT_MS.items():
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def duration(low_ms: int, high_ms: int) -> Callable[[str], int]:
    """The type of a duration from ``low_ms`` to ``high_ms``: ``500ms``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w``."""

    def parse(text: str) -> int:
        match = _DURATION.fullmatch(text.strip())
        value = None if match is None else int(match[1]) * _UNIT_MS[match[2]]
        if value is None or not low_ms <= value <= high_ms:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration from {shown_ms(low_ms)} to {shown_ms(high_ms)} "
                "(such as 500ms, 90s, 30m, 12h, 7d or 2w)"
            )
        return value

    return parse


def signed(low: int, high: int) -> Callable[[str], int]:
    """The type of an integer from ``low`` to ``high`` (ASCII digits, an optional leading ``-``; no ``+``)."""

    def parse(text: str) -> int:
        if _SIGNED.fullmatch(text) is None or not low <= int(text) <= high:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise argparse.ArgumentTypeError(f"{shown!r} is not an integer from {low} to {high}")
        return int(text)

    return parse


def optional_duration(low_ms: int, high_ms: int) -> Callable[[str], int | None]:
    """``duration(low_ms, high_ms)``, or ``none`` for no duration at all."""
    parse = duration(low_ms, high_ms)
    return lambda text: None if text == "none" else parse(text)


def whole(low: int, high: int) -> Callable[[str], int]:
    """The type of a whole number from ``low`` to ``high`` (ASCII digits; no sign, no exponent)."""

    def parse(text: str) -> int:
        if _WHOLE.fullmatch(text) is None or not low <= int(text) <= high:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise argparse.ArgumentTypeError(f"{shown!r} is not a whole number from {low} to {high}")
        return int(text)

    return parse


def optional_whole(low: int, high: int) -> Callable[[str], int | None]:
    """``whole(low, high)``, or ``none`` for no number at all (a limit cleared)."""
    parse = whole(low, high)
    return lambda text: None if text == "none" else parse(text)


def seconds(low: float, high: float) -> Callable[[str], float]:
    """The type of a finite number of seconds from ``low`` to ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:  # NaN fails every comparison
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from {low:g} to {high:g}")
        return value

    return parse


def json_value(text: str) -> Any:
    """A job body given as strict JSON text (no NaN or Infinity, no repeated keys): ``null`` is a body too."""
    try:
        return loads_strict(text.encode("utf-8", "surrogateescape"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None


port = whole(0, MAX_PORT)

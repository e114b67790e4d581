"""Cron expressions and their fire times in an IANA time zone (no I/O here: ``zoneinfo`` is the standard library's).

An expression has the five standard fields, ``minute hour day-of-month month day-of-week``, each a ``*``, a number,
a range ``a-b``, a step ``*/n`` or ``a-b/n``, or a list of those (``1,15,30-40/5``); months take ``jan``…``dec``
and days ``sun``…``sat`` (names in any case; ``0`` and ``7`` are both Sunday). ``@hourly``, ``@daily``
(``@midnight``), ``@weekly``, ``@monthly`` and ``@yearly`` (``@annually``) stand for their usual expressions.

Day of month and day of week combine as Vixie cron does: if either field starts with ``*``, a day must match both
(the ``*`` one matches any day); if both are restricted, a day matching either one matches (``0 0 1 * mon``: the
first of the month and every Monday).

**Time zones and daylight saving time.** The fields are read on the wall clock of the schedule's zone. The fire times
are the instants of every matching wall-clock minute, each resolved by one rule (``resolve``):
- a wall time that exists once is that instant;
- a wall time that does not exist (the clocks jumped over it, spring forward) fires once, at the end of the gap:
  ``30 2 * * *`` in Europe/Berlin fires at 03:00 local on the last Sunday of March; every minute of a skipped hour
  resolves to the same instant, which fires once;
- a wall time that exists twice (the clocks went back, fall back) fires once, at its first occurrence: ``30 2 * * *``
  fires at 02:30 summer time, not again an hour later; ``*/5 * * * *`` fires through the first pass of the repeated
  hour and is silent during the second.
Resolving is monotonic in the wall time, so the fire times are the resolved instants in order, each once.
"""

from __future__ import annotations

import calendar
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as wall_time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTH_NAMES = {name: n for n, name in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep",
                                                   "oct", "nov", "dec"), start=1)}  # fmt: skip
DAY_NAMES = {name: n for n, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: The longest an expression can go without firing is the eight years between two 29ths of February across 2100:
#: a walk through the calendar stops after this many days (a valid expression always fires within them).
MAX_DAYS = 366 * 9
#: A zone never sets its clocks back further than this at once: a search backwards from a time starts this far
#: ahead of its wall clock, so that the second pass of a repeated hour is not missed.
MAX_FOLD = timedelta(hours=26)
_EXPRESSION_CHARS = 200


@dataclass(frozen=True)
class Field:
    """One field's bounds and names."""

    name: str
    low: int
    high: int
    names: dict[str, int]


FIELDS = (
    Field("minute", 0, 59, {}),
    Field("hour", 0, 23, {}),
    Field("day of month", 1, 31, {}),
    Field("month", 1, 12, MONTH_NAMES),
    Field("day of week", 0, 7, DAY_NAMES),
)


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression (``Cron.parse``): the values each field matches."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday … 6 = Saturday (a 7 is stored as 0)
    #: Vixie's rule: a field written starting with ``*`` makes the day a match of both fields, not of either.
    either_day: bool

    @classmethod
    def parse(cls, text: object) -> Cron:
        """``text`` parsed (``TypeError`` if not a ``str``; ``ValueError`` naming the field and what is wrong, or
        saying that it never fires: ``0 0 30 2 *``)."""
        return _parse(text)

    def day_matches(self, day: date) -> bool:
        """Whether the date is one the expression fires on (month, then day of month and day of week)."""
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        return (in_month or in_week) if self.either_day else (in_month and in_week)

    def walls(self, start: datetime, forward: bool = True) -> Iterator[datetime]:
        """Every matching wall-clock minute from ``start`` (naive, local; included if it matches), in time order
        or (``forward=False``) backwards, for at most ``MAX_DAYS`` days."""
        hours = self.hours if forward else self.hours[::-1]
        minutes = self.minutes if forward else self.minutes[::-1]
        day, first = start.date(), True
        step = timedelta(days=1 if forward else -1)
        for _ in range(MAX_DAYS):
            if self.day_matches(day):
                for hour in hours:
                    if first and _ahead_of(start.hour, hour, forward):
                        continue
                    partial = first and hour == start.hour
                    for minute in minutes:
                        if not (partial and _ahead_of(start.minute, minute, forward)):
                            yield datetime.combine(day, wall_time(hour, minute))
            day, first = day + step, False

    def fire_times(self, after_ms: int, tz: str) -> Iterator[int]:
        """The fire times (epoch ms) after ``after_ms``, in order, each once (``docs/schedules.md``, DST rules)."""
        zone = zone_of(tz)
        start = _wall(after_ms, zone).replace(second=0, microsecond=0) + timedelta(minutes=1)
        last = after_ms
        for wall in self.walls(start):
            at = resolve(wall, zone)
            if at > last:  # a skipped hour's minutes resolve to one instant; a repeated hour's second pass to earlier
                last = at
                yield at

    def fire_times_back(self, until_ms: int, tz: str) -> Iterator[int]:
        """The fire times at or before ``until_ms``, newest first, each once."""
        zone = zone_of(tz)
        start = (_wall(until_ms, zone) + MAX_FOLD).replace(second=0, microsecond=0)
        last = until_ms + 1
        for wall in self.walls(start, forward=False):
            at = resolve(wall, zone)
            if at < last:
                last = at
                yield at

    def count(self, first_ms: int, through_ms: int, tz: str) -> int:
        """How many fire times lie in ``[first_ms, through_ms]``: a whole day whose offset does not change is
        counted from the fields (every matching minute of it exists once), any other part walked."""
        zone = zone_of(tz)
        per_day = len(self.hours) * len(self.minutes)
        total, cursor = 0, first_ms - 1  # counted: the fire times up to ``cursor``
        while cursor < through_ms:
            day = _wall(cursor + 1, zone).date()
            start = resolve(datetime.combine(day, wall_time()), zone)
            midnight = resolve(datetime.combine(day + timedelta(days=1), wall_time()), zone)
            end = min(through_ms, midnight - 1)
            steady = _offset(start, zone) == _offset(midnight - 1, zone)
            if steady and cursor == start - 1 and end == midnight - 1:
                total += per_day if self.day_matches(day) else 0
            else:
                total += sum(1 for at in itertools.takewhile(end.__ge__, self.fire_times(cursor, tz)))
            cursor = end
        return total

    def next_after(self, after_ms: int, tz: str) -> int:
        """The first fire time after ``after_ms``."""
        for at in self.fire_times(after_ms, tz):
            return at
        raise ValueError(f"cron {self.text!r} does not fire within {MAX_DAYS} days of {after_ms}")  # never, if parsed


@functools.lru_cache(maxsize=256)
def zone_of(tz: str) -> ZoneInfo:
    """The IANA zone named ``tz`` (``ValueError`` if there is none of that name)."""
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ValueError(f"unknown time zone {tz!r} (an IANA name such as 'Europe/Berlin' or 'UTC')") from error


def check_zone(tz: object, name: str = "tz") -> str:
    """``tz`` if it is a ``str`` naming an IANA time zone (``TypeError`` / ``ValueError`` otherwise)."""
    if type(tz) is not str:
        raise TypeError(f"{name} must be a str naming an IANA time zone, not {type(tz).__name__}")
    if not 1 <= len(tz) <= 64 or not tz.isprintable() or tz.strip() != tz or ".." in tz or tz.startswith("/"):
        raise ValueError(f"{name} must name an IANA time zone, such as 'Europe/Berlin', not {tz!r}")
    zone_of(tz)
    return tz


def resolve(wall: datetime, zone: ZoneInfo) -> int:
    """The instant (epoch ms) a naive wall-clock time fires at in ``zone``: itself if it exists (its first
    occurrence if it exists twice), the end of the gap if the clocks jumped over it."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return _ms(first)
    # In a gap: fold=0 read it with the offset before the jump (an instant after the jump), fold=1 with the offset
    # after (an instant before it). The jump lies between; find its second.
    low = _ms(wall.replace(tzinfo=zone, fold=1).astimezone(UTC)) // 1000
    high = _ms(first) // 1000
    after = first.astimezone(zone).utcoffset()
    while low + 1 < high:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return high * 1000


def _ahead_of(bound: int, value: int, forward: bool) -> bool:
    """Whether ``value`` comes before ``bound`` in the walk's direction (a walk starting at ``bound`` skips it)."""
    return value < bound if forward else value > bound


def _wall(at_ms: int, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time at an instant."""
    return datetime.fromtimestamp(at_ms / 1000, zone).replace(tzinfo=None)


def _offset(at_ms: int, zone: ZoneInfo) -> timedelta | None:
    return datetime.fromtimestamp(at_ms / 1000, zone).utcoffset()


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


# -- parsing --------------------------------------------------------------------------------------------------


def _parse(text: object) -> Cron:
    if type(text) is not str:
        raise TypeError(f"cron must be a str, not {type(text).__name__}")
    if not 1 <= len(text) <= _EXPRESSION_CHARS or not text.isprintable():
        raise ValueError(f"cron must be 1-{_EXPRESSION_CHARS} printable characters, not {text!r}")
    expression = MACROS.get(text.strip().lower(), text)
    parts = expression.split()
    if len(parts) != 5:
        raise ValueError(
            f"cron {text!r} must have five fields (minute hour day-of-month month day-of-week) or be one of"
            f" {sorted(MACROS)}"
        )
    values = [_field(part, spec, text) for part, spec in zip(parts, FIELDS, strict=True)]
    weekdays = frozenset(value % 7 for value in values[4])
    either = not (parts[2].startswith("*") or parts[4].startswith("*"))
    parsed = Cron(text, tuple(sorted(values[0])), tuple(sorted(values[1])), frozenset(values[2]),
                  frozenset(values[3]), weekdays, either)  # fmt: skip
    if not either and not parts[2].startswith("*") and not _some_day_exists(parsed):
        raise ValueError(f"cron {text!r} never fires: no month it names has such a day")
    return parsed


def _some_day_exists(cron: Cron) -> bool:
    """Whether some month of the expression has one of its days of the month (February counted with 29)."""
    return any(day <= calendar.monthrange(2024, month)[1] for month in cron.months for day in cron.days)


def _field(text: str, spec: Field, whole: str) -> set[int]:
    found: set[int] = set()
    for item in text.split(","):
        found |= _item(item, spec, whole)
    return found


def _item(item: str, spec: Field, whole: str) -> set[int]:
    """One list item: ``*``, ``n``, ``a-b``, each with an optional ``/step`` (after ``*`` or a range only)."""
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        step = _number(step_text, spec, whole, step=True)
    if body == "*":
        low, high = spec.low, spec.high
    elif "-" in body:
        first, _, last = body.partition("-")
        low, high = _number(first, spec, whole), _number(last, spec, whole)
        if low > high:
            raise ValueError(f"cron {whole!r}: the {spec.name} range {body!r} runs backwards")
    elif slash:
        raise ValueError(f"cron {whole!r}: a {spec.name} step goes after '*' or a range, not {item!r}")
    else:
        low = high = _number(body, spec, whole)
    return set(range(low, high + 1, step))


def _number(text: str, spec: Field, whole: str, *, step: bool = False) -> int:
    value = spec.names.get(text.lower()) if not step else None
    if value is None and text.isascii() and text.isdigit() and len(text) <= 2:
        value = int(text)
    low, high = (1, spec.high - spec.low + 1) if step else (spec.low, spec.high)
    if value is None or not low <= value <= high:
        what = "step" if step else "value"
        raise ValueError(f"cron {whole!r}: the {spec.name} {what} {text!r} is not in {low}-{high}")
    return value

"""Cron expressions and their fire times (``asyncq.core.cron``): the five fields, names, ranges, steps and lists,
Vixie's day-of-month/day-of-week rule, and the DST rules of ``docs/schedules.md`` on the spring and fall days of
Europe/Berlin and America/New_York (a local time that does not exist fires once at the end of the gap; a repeated
one fires once, at its first occurrence). Fire times are checked against a brute-force walk of every minute."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from asyncq.core.cron import Cron, check_zone, resolve

pytestmark = pytest.mark.timeout(60)

BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"


def at(text: str, tz: str = "UTC") -> int:
    """Epoch ms of a wall-clock time in ``tz`` (an ISO string; ``+hh:mm`` in it wins, to name one of two)."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=ZoneInfo(tz))
    return int(moment.timestamp() * 1000)


def local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).isoformat()


def fires(expression: str, after: str, count: int, tz: str) -> list[str]:
    """The first ``count`` fire times after ``after`` (wall time in ``tz``), as local ISO times with their offset."""
    times = Cron.parse(expression).fire_times(at(after, tz), tz)
    return [local(ms, tz) for ms in itertools.islice(times, count)]


# -- DST: the spring and fall days ------------------------------------------------------------------------------


def test_a_time_in_the_spring_gap_fires_once_at_the_end_of_the_gap_in_berlin() -> None:
    assert fires("30 2 * * *", "2024-03-30T00:00", 3, BERLIN) == [
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:00:00+02:00",  # 02:30 does not exist on the spring day: the end of the gap
        "2024-04-01T02:30:00+02:00",
    ]


def test_every_minute_of_the_skipped_hour_fires_once_at_its_end_in_berlin() -> None:
    assert fires("*/15 * * * *", "2024-03-31T01:30", 4, BERLIN) == [
        "2024-03-31T01:45:00+01:00",
        "2024-03-31T03:00:00+02:00",  # 02:00, 02:15, 02:30, 02:45 and 03:00 itself: one fire
        "2024-03-31T03:15:00+02:00",
        "2024-03-31T03:30:00+02:00",
    ]


def test_a_repeated_time_fires_once_at_its_first_occurrence_in_berlin() -> None:
    assert fires("30 2 * * *", "2024-10-26T12:00", 2, BERLIN) == [
        "2024-10-27T02:30:00+02:00",  # summer time: the first of the two 02:30s
        "2024-10-28T02:30:00+01:00",
    ]
    assert fires("*/20 * * * *", "2024-10-27T01:50+02:00", 5, BERLIN) == [
        "2024-10-27T02:00:00+02:00",
        "2024-10-27T02:20:00+02:00",
        "2024-10-27T02:40:00+02:00",
        "2024-10-27T03:00:00+01:00",  # the repeated hour's second pass (02:00-02:59 CET) is silent
        "2024-10-27T03:20:00+01:00",
    ]


def test_a_search_from_inside_the_repeated_hour_finds_no_second_pass_in_berlin() -> None:
    assert fires("*/20 * * * *", "2024-10-27T02:10+01:00", 1, BERLIN) == ["2024-10-27T03:00:00+01:00"]


def test_new_york_spring_gap_and_fall_repeat() -> None:
    assert fires("30 2 * * *", "2024-03-09T12:00", 2, NEW_YORK) == [
        "2024-03-10T03:00:00-04:00",
        "2024-03-11T02:30:00-04:00",
    ]
    assert fires("30 1 * * *", "2024-11-02T12:00", 2, NEW_YORK) == [
        "2024-11-03T01:30:00-04:00",  # EDT, the first 01:30; not 01:30 EST an hour later
        "2024-11-04T01:30:00-05:00",
    ]
    assert fires("0 * * * *", "2024-11-02T23:30", 4, NEW_YORK) == [
        "2024-11-03T00:00:00-04:00",
        "2024-11-03T01:00:00-04:00",
        "2024-11-03T02:00:00-05:00",  # 01:00 EST is the repeated 01:00: silent
        "2024-11-03T03:00:00-05:00",
    ]


@pytest.mark.parametrize(
    ("tz", "day"), [(BERLIN, "2024-03-31"), (BERLIN, "2024-10-27"), (NEW_YORK, "2024-03-10"), (NEW_YORK, "2024-11-03")]
)
def test_on_a_dst_day_fire_times_are_the_resolved_matching_minutes_each_once_in_order(tz: str, day: str) -> None:
    """Brute force: every matching wall minute of the day resolved by the rule, as a set, equals the fire times."""
    cron = Cron.parse("*/10 * * * *")
    zone = ZoneInfo(tz)
    start = datetime.fromisoformat(day)
    walls = [start + timedelta(minutes=m) for m in range(0, 24 * 60, 10)]
    expected = sorted({resolve(wall, zone) for wall in walls})
    found = list(itertools.takewhile(lambda ms: ms < expected[-1] + 1, cron.fire_times(expected[0] - 1, tz)))
    assert found == expected
    assert len(found) == len(set(found)) == len(walls) - (6 if "-03-" in day else 0)  # the gap's six minutes merge
    back = list(itertools.takewhile(lambda ms: ms >= expected[0], cron.fire_times_back(expected[-1], tz)))
    assert back == expected[::-1]
    assert cron.count(expected[0], expected[-1], tz) == len(expected)


def test_counting_a_year_is_exact_across_both_dst_days() -> None:
    cron = Cron.parse("*/7 1-3 * * *")
    first, through = at("2024-01-01T00:00", BERLIN), at("2025-01-01T00:00", BERLIN)
    walked = sum(1 for _ in itertools.takewhile(lambda ms: ms <= through, cron.fire_times(first - 1, BERLIN)))
    assert cron.count(first, through, BERLIN) == walked


# -- the fields --------------------------------------------------------------------------------------------------


def test_vixie_day_rule_either_day_when_both_are_restricted_both_when_one_is_a_star() -> None:
    assert fires("0 0 13 * fri", "2024-09-01T00:00", 4, "UTC") == [
        "2024-09-06T00:00:00+00:00",  # a Friday
        "2024-09-13T00:00:00+00:00",  # the 13th (and a Friday)
        "2024-09-20T00:00:00+00:00",
        "2024-09-27T00:00:00+00:00",
    ]
    thirteenths = ["2024-09-13T00:00:00+00:00", "2024-10-13T00:00:00+00:00"]
    assert fires("0 0 13 * *", "2024-09-01T00:00", 2, "UTC") == thirteenths
    # A field starting with * makes the day a match of both: odd days of the month that are Fridays.
    assert fires("0 0 */2 * fri", "2024-09-01T00:00", 2, "UTC") == [
        "2024-09-13T00:00:00+00:00",
        "2024-09-27T00:00:00+00:00",
    ]


def test_names_ranges_steps_lists_sunday_as_seven_and_macros() -> None:
    assert fires("0 9 * JAN-mar Mon-Fri", "2024-03-29T10:00", 2, "UTC") == [
        "2025-01-01T09:00:00+00:00",  # a Wednesday in January, after March's last weekday
        "2025-01-02T09:00:00+00:00",
    ]
    assert fires("0 0 * * 7", "2024-09-01T00:00", 1, "UTC") == fires("0 0 * * sun", "2024-09-01T00:00", 1, "UTC")
    assert fires("5,10-20/5 */6 * * *", "2024-09-01T00:00", 5, "UTC") == [
        "2024-09-01T00:05:00+00:00",
        "2024-09-01T00:10:00+00:00",
        "2024-09-01T00:15:00+00:00",
        "2024-09-01T00:20:00+00:00",
        "2024-09-01T06:05:00+00:00",
    ]
    assert fires("@daily", "2024-09-01T12:00", 1, "UTC") == ["2024-09-02T00:00:00+00:00"]
    assert fires("@hourly", "2024-09-01T12:00", 1, "UTC") == ["2024-09-01T13:00:00+00:00"]
    assert fires("0 0 29 2 *", "2097-01-01T00:00", 1, "UTC") == ["2104-02-29T00:00:00+00:00"]  # 2100 is no leap year


def _brute_force(cron: Cron, after_ms: int, count: int) -> list[int]:
    """Every UTC minute after ``after_ms`` that the fields match, by an independent rule (Vixie's)."""
    found: list[int] = []
    minute = datetime.fromtimestamp(after_ms / 1000, UTC).replace(second=0, microsecond=0)
    while len(found) < count:
        minute += timedelta(minutes=1)
        dom, dow = minute.day in cron.days, minute.isoweekday() % 7 in cron.weekdays
        day = (dom or dow) if cron.either_day else (dom and dow)
        if minute.minute in cron.minutes and minute.hour in cron.hours and minute.month in cron.months and day:
            found.append(int(minute.timestamp() * 1000))
    return found


def _random_field(rng: random.Random, low: int, high: int) -> str:
    kind = rng.randrange(5)
    a, b = sorted(rng.sample(range(low, high + 1), 2))
    return ["*", str(a), f"{a}-{b}", f"*/{rng.randint(1, 7)}", f"{a},{b}"][kind]


def test_random_expressions_agree_with_a_brute_force_walk_in_utc() -> None:
    rng = random.Random(29)
    after = at("2024-02-27T22:00")
    for _ in range(60):
        fields = [_random_field(rng, 0, 59), _random_field(rng, 0, 23), _random_field(rng, 1, 28), "*",
                  _random_field(rng, 0, 6)]  # fmt: skip
        cron = Cron.parse(" ".join(fields))
        expected = _brute_force(cron, after, 5)
        assert list(itertools.islice(cron.fire_times(after, "UTC"), 5)) == expected, cron.text


# -- refused -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("* * *", "five fields"),
        ("* * * * * *", "five fields"),
        ("60 * * * *", "minute value '60'"),
        ("* 24 * * *", "hour value '24'"),
        ("* * 0 * *", "day of month value '0'"),
        ("* * * 13 *", "month value '13'"),
        ("* * * * 8", "day of week value '8'"),
        ("* * * foo *", "month value 'foo'"),
        ("10-5 * * * *", "runs backwards"),
        ("*/0 * * * *", "step '0'"),
        ("5/10 * * * *", r"after '\*' or a range"),
        ("-1 * * * *", "minute value"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 apr,jun *", "never fires"),
        ("", "1-200 printable"),
        ("0 0\n* * *", "1-200 printable"),
        ("١ * * * *", "minute value"),
    ],
)
def test_a_bad_expression_is_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Cron.parse(text)


def test_an_expression_that_is_not_a_str_is_a_type_error_and_a_feb_30th_with_a_weekday_still_fires() -> None:
    with pytest.raises(TypeError):
        Cron.parse(5)
    assert Cron.parse("0 0 30 2 mon").either_day  # Mondays of February: it fires


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", " UTC", "../etc/passwd", "/etc/localtime", "Europe/Berlin\n"])
def test_an_unknown_zone_is_refused(tz: str) -> None:
    with pytest.raises(ValueError):
        check_zone(tz)
    with pytest.raises(TypeError):
        check_zone(None)

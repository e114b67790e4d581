"""How the ``asyncq`` command prints a job's errors (``show``: every attempt's, with its traceback indented;
``dead``: the last one, on one line, cut), from the values ``Queue.get`` returns. The store does not record errors
yet, so these run the renderers on ``Job`` values built here; the end-to-end test waits for the store's table."""

from __future__ import annotations

import json

from asyncq.cli.output import render_dead, render_show
from asyncq.cli.records import error_record, job_record, one_line_error
from asyncq.core.jobs import AttemptError, Job

T0 = 1_700_000_000_000
TRACE = 'Traceback (most recent call last):\n  File "handlers.py", line 3, in handle\nValueError: no qty\n'


def dead_job(*errors: AttemptError) -> Job:
    return Job(5, "tired", "mail", {"n": 1}, "dead", 2, 2, 2, T0, T0 + 60_000, None, None, "exhausted", 1, errors)


def test_show_prints_every_attempts_error_with_its_traceback_indented() -> None:
    first = AttemptError(1, T0 + 1_000, "TimeoutError", "the receiver took 10 s", "Traceback …\nTimeoutError\n")
    second = AttemptError(2, T0 + 5_000, "ValueError", "no qty", TRACE)
    job = dead_job(first, second)
    record = job_record(job, body=True) | {"errors": [error_record(error) for error in job.errors]}
    text = render_show({"path": "q.db", "now_ms": T0 + 65_000, "job": record, "history": []})
    lines = text.splitlines()
    start = lines.index("errors of 2 failed attempt(s):")
    assert lines[start + 1] == "attempt 1 at 2023-11-14T22:13:21Z (1m04s ago): TimeoutError: the receiver took 10 s"
    assert lines[start + 2 : start + 4] == ["    Traceback …", "    TimeoutError"]
    assert lines[start + 4] == "attempt 2 at 2023-11-14T22:13:25Z (1m00s ago): ValueError: no qty"
    assert lines[start + 5 : start + 8] == [f"    {line}" for line in TRACE.splitlines()]
    assert "errors" not in [line.split()[0] for line in lines[:start] if line]  # not among the columns
    json.dumps(record)  # --json prints the same record


def test_show_says_when_no_error_was_recorded() -> None:
    record = job_record(dead_job(), body=True) | {"errors": []}
    assert "no errors recorded" in render_show({"path": "q.db", "now_ms": T0, "job": record, "history": []})


def test_dead_prints_each_jobs_last_error_on_one_cut_line() -> None:
    long = AttemptError(2, T0, "ValueError", "line one\nline two " + "x" * 200, TRACE)
    earlier = AttemptError(1, T0, "KeyError", "'qty'", TRACE)
    records = [
        job_record(dead_job(earlier, long)) | {"last_error": error_record(long)},
        job_record(dead_job()) | {"last_error": None},
    ]
    data = {"by_reason": {"exhausted": 2}, "jobs": records, "now_ms": T0, "count": 2, "more": False}
    header, _blank, columns, first, second, count = render_dead(data).splitlines()
    assert header == "dead jobs by reason: exhausted 2" and count == "2 job(s)"
    assert columns.split()[-2:] == ["last", "error"]
    shown = first[columns.index("last error") :]
    assert shown == one_line_error(records[0]["last_error"]) and len(shown) == 80
    assert shown.startswith("ValueError: line one line two xxx") and shown.endswith("…") and "KeyError" not in first
    assert second.rstrip().endswith("-")


def test_one_line_error_keeps_a_short_message_whole() -> None:
    error = error_record(AttemptError(1, T0, "Permanent", "refused by the receiver", ""))
    assert one_line_error(error) == "Permanent: refused by the receiver"
    assert one_line_error(None) == "-"

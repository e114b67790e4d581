"""Mistakes a user makes with asyncq's typed edges, as ``mypy --strict`` sees them in a user's script: each line
of ``MISTAKES`` must be reported on its own line with the error fragment given, each line of ``CORRECT`` must not
be reported, and nothing else may be. One mypy run checks the whole table (a new case is one more row).

The snippets run inside ``async def main(queue: asyncq.Queue, app: asyncq.App, observer: PoolMetrics)``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]

#: (a line of a user's code, a fragment of the error mypy must report on that line)
MISTAKES: list[tuple[str, str]] = [
    ("app.pool(queue, bogus=1)", 'Unexpected keyword argument "bogus" for "pool" of "App"'),
    ("await app.run_worker(queue, concurency=4)", 'Unexpected keyword argument "concurency" for "run_worker"'),
    ('app.lifespan("app.db", leese=30)', 'Unexpected keyword argument "leese" for "lifespan" of "App"'),
    ('app.pool(queue, concurrency="8")', 'Argument "concurrency" to "pool" of "App" has incompatible type "str"'),
    ("asyncq.Pool(queue, owner=1)", 'Argument "owner" to "Pool" has incompatible type "int"'),
    ("asyncq.Pool(queue, lease_ms=1000)", 'Unexpected keyword argument "lease_ms" for "Pool"'),
    ('PoolSettings(retry="fast")', 'Argument "retry" to "PoolSettings" has incompatible type "str"'),
    ("asyncq.Pool(queue, observer=1)", 'Argument "observer" to "Pool" has incompatible type "int"'),
]

#: Lines that must type-check: the same calls, used as documented.
CORRECT: list[str] = [
    "app.pool(queue, concurrency=8, lease=30, owner='w1', observer=observer)",
    "await app.run_worker(queue, burst=True, concurrency=4, retry=asyncq.RetryPolicy(base=2))",
    "app.lifespan('app.db', worker=False, concurrency=4, busy_timeout=1.0)",
    "asyncq.Pool(queue, PoolSettings(concurrency=2, linger=0.01))",
]

HEADER = """\
import asyncq
from asyncq.web.metrics import PoolMetrics
from asyncq.worker.settings import PoolSettings


async def main(queue: asyncq.Queue, app: asyncq.App, observer: PoolMetrics) -> None:
"""


def test_mypy_reports_each_mistake_on_its_line(tmp_path: Path) -> None:
    lines = [*(snippet for snippet, _fragment in MISTAKES), *CORRECT]
    script = tmp_path / "user_script.py"
    script.write_text(HEADER + "".join(f"    {line}\n" for line in lines))
    first = HEADER.count("\n") + 1
    expected = {first + n: fragment for n, (_snippet, fragment) in enumerate(MISTAKES)}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
         "--hide-error-context", "--no-pretty", script.name],
        cwd=tmp_path, env=os.environ | {"MYPYPATH": str(ROOT)}, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    reported: dict[int, list[str]] = {}
    for found in re.finditer(rf"^{re.escape(script.name)}:(\d+): error: (.*)$", done.stdout, re.MULTILINE):
        reported.setdefault(int(found[1]), []).append(found[2])
    assert reported, done.stdout + done.stderr  # mypy ran and found the mistakes (not a crash, not nothing)
    for line, fragment in expected.items():
        assert any(fragment in message for message in reported.get(line, [])), (lines[line - first], reported)
    unexpected = {line: messages for line, messages in reported.items() if line not in expected}
    assert unexpected == {}, "\n".join(f"{lines[n - first]}: {m}" for n, m in unexpected.items())

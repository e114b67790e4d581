"""The public API's types reach a user's code: ``mypy --strict`` on a small script that misuses it reports each
misuse (before this, ``asyncq.Queue`` was ``Any`` to mypy through the lazy ``__getattr__``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """\
import asyncq
from asyncq import Pool, Queue, RetryPolicy


async def main() -> None:
    queue = await Queue.open(123)  # MISUSE: open-int
    queue.no_such_method()  # MISUSE: no-method
    added: str = await queue.enqueue("job", {})  # MISUSE: enqueue-returns-bool
    await queue.enqueue("job", {}, max_attempts="3")  # MISUSE: attempts-str
    pool = Pool(queue, concurrency="4")  # MISUSE: concurrency-str
    pool.register("default", 42)  # MISUSE: handler-int
    RetryPolicy(cap_ms=1.5)  # MISUSE: cap-float
    asyncq.NoSuchThing  # MISUSE: no-name
    job = await queue.get("job")
    print(job.status)  # MISUSE: optional-job
    good = await Queue.open("fine.db")  # a correct call: no error on this line
    await good.close()
"""


def test_mypy_strict_reports_each_misuse_of_the_public_api(tmp_path: Path) -> None:
    script = tmp_path / "user_app.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=170,
    )
    flagged = {int(m.group(1)) for m in re.finditer(r"user_app\.py:(\d+): error", done.stdout)}
    expected = {n for n, line in enumerate(SCRIPT.splitlines(), 1) if "# MISUSE" in line}
    assert flagged == expected, done.stdout
    assert done.returncode == 1

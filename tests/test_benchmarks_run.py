"""Every benchmark still runs against the current code: each one's ``--quick`` smoke run, in a child process.

Speed is not judged here (benchmarks measure it, tests do not); what is checked is that each script ends
cleanly, prints its table with a verdict, and writes nothing to docs/benchmarks.md in quick mode. A statement
that changes shape (as the finish's compare-and-set once did) breaks the benchmarks that send it directly.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"

# script and its options, a line its table prints
BENCHMARKS = [
    ("http_delivery.py", "HTTP delivery to the inbox receiver"),
    ("http_delivery.py --producer alongside --burn-us 10", "the pool's producer enqueues while it delivers"),
    ("throughput.py", "throughput (jobs/s, medians"),
    ("claim_depth.py", "claim + finish(ok) latency"),
    ("stats_depth.py", "Queue.stats() at depth"),
    ("pool_floor.py", "the pool against the set-based floor"),
    ("processes.py", "worker processes on one file"),
    ("wakeup.py", "wake-up latency"),
    ("singles.py --modes same other", "one-at-a-time enqueues while the pool runs"),
]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("command", "title"), BENCHMARKS, ids=[command for command, _ in BENCHMARKS])
def test_the_benchmark_runs_quick_and_writes_no_docs(command: str, title: str, tmp_path: Path) -> None:
    script, *options = command.split()
    before = digest(DOCS)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", *options],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert title in done.stdout
    assert re.search(r"\bmet\b", done.stdout), done.stdout  # a verdict ("met", "NOT met") as a word
    assert digest(DOCS) == before

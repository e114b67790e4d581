"""Every benchmark still runs against the current code: each one's ``--quick`` smoke run, in a child process.

Speed is not judged here (benchmarks measure it, tests do not); what is checked is that each script ends
cleanly, prints its table with a verdict, and writes nothing to docs/benchmarks.md in quick mode. A statement
that changes shape (as the finish's compare-and-set once did) breaks the benchmarks that send it directly.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"

# script, a line its table prints
BENCHMARKS = [
    ("http_delivery.py", "HTTP delivery to the inbox receiver"),
    ("throughput.py", "throughput (jobs/s, medians"),
    ("claim_depth.py", "claim + finish(ok) latency"),
]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("script", "title"), BENCHMARKS, ids=[script for script, _ in BENCHMARKS])
def test_the_benchmark_runs_quick_and_writes_no_docs(script: str, title: str, tmp_path: Path) -> None:
    before = digest(DOCS)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert title in done.stdout
    assert "met" in done.stdout  # a verdict column ("met" or "NOT met")
    assert digest(DOCS) == before

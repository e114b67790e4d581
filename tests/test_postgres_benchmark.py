"""``benchmarks/postgres.py`` still runs against the current code: its ``--quick`` smoke run (200 jobs, 1 and 2
worker processes, one round) on the test server, in a child process. Speed is not judged here; what is checked is
that every installed library drained every job (the script refuses a run that left one), that the table and the
verdicts are printed, and that nothing is written to docs/benchmarks.md. A peer that is not installed is skipped by
the script, which says so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from postgres_support import run_database

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("postgres_database")]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_postgres_benchmark_runs_quick_and_writes_no_docs(tmp_path: Path) -> None:
    before = digest(DOCS)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "postgres.py"), "--quick", "--jobs", "200", "--batch", "50"],
        capture_output=True,
        text=True,
        timeout=230,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "ASYNCQ_BENCH_POSTGRES": run_database()},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "PostgreSQL queues, 200 jobs, 16 tasks a process (medians)" in out
    libraries = ["asyncq"] + [name for name in ("pgqueuer", "procrastinate") if importlib.util.find_spec(name)]
    for name in libraries:
        for processes in (1, 2):
            assert any(line.split()[:2] == [name, str(processes)] for line in out.splitlines()), (name, out)
    for name in {"pgqueuer", "procrastinate"} - set(libraries):
        assert name in out.split("skipped:", 1)[1].splitlines()[0]
    assert "asyncq 2 processes ≥ 1.5× 1 process end to end" in out
    assert re.search(r"\bmet\b", out), out  # a verdict ("met", "NOT met") as a word
    assert digest(DOCS) == before

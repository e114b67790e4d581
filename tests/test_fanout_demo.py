"""The main job (`make demo`) at a small size, kill included, with its report and its narration checked (one
run, shared by the tests of this module)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = 3000
KILLED = re.compile(
    r"worker 1 killed with SIGKILL at (?P<done>[\d,]+) jobs done; waiting for its (?P<leases>\d+) leases to expire"
    r" \(up to 2 s\), then worker 2 claims them again"
)
TAKEN_OVER = re.compile(
    r"worker 1's (?P<leases>\d+) leases expired; worker 2 claimed them again (?P<seconds>[\d.]+) s after the kill"
)


class Run:
    """One finished ``fanout.py --jobs 3000`` and the folder it left."""

    def __init__(self, folder: Path, done: subprocess.CompletedProcess[str]) -> None:
        self.folder = folder
        self.code = done.returncode
        self.output = done.stdout + done.stderr
        self.lines = done.stdout.splitlines()

    def figures(self) -> dict[str, str]:
        """The report's table: name -> value."""
        table = [line for line in self.lines if "  " in line and not line.startswith(("[", "files", "worker 1"))]
        return {name.strip(): value.strip() for name, value in (line.rsplit("  ", 1) for line in table)}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    folder = tmp_path_factory.mktemp("fanout")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fanout.py"), "--jobs", str(JOBS), "--dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=folder,
    )
    return Run(folder, done)


@pytest.mark.timeout(180)
def test_fanout_survives_a_killed_worker_with_every_job_applied_once(run: Run) -> None:
    assert run.code == 0, run.output
    figures = run.figures()
    assert figures["enqueued"] == str(JOBS)
    assert figures["applied (inbox rows)"] == str(JOBS)
    assert figures["stock (sum of qty)"] == str(JOBS)
    assert int(figures["leases reclaimed after the kill"]) >= 1
    assert figures["dead"] == "0"
    assert "every job applied exactly once" in run.output
    # The files are left for an operator to inspect; the receiver's rows agree with the report.
    assert (run.folder / "queue.db").exists() and (run.folder / "inbox.db").exists()


@pytest.mark.timeout(180)
def test_fanout_says_when_it_kills_the_worker_and_why_the_bar_then_waits(run: Run) -> None:
    assert run.code == 0, run.output
    killed = [(n, m) for n, line in enumerate(run.lines) if (m := KILLED.fullmatch(line))]
    taken_over = [(n, m) for n, line in enumerate(run.lines) if (m := TAKEN_OVER.fullmatch(line))]
    assert len(killed) == 1 and len(taken_over) == 1, run.output
    (kill_line, kill), (over_line, over) = killed[0], taken_over[0]
    report = next(n for n, line in enumerate(run.lines) if line.startswith("enqueued "))
    assert kill_line < over_line < report  # in the order it happens, before the report
    assert JOBS // 10 <= int(kill["done"].replace(",", "")) <= JOBS * 7 // 10
    reclaimed = int(run.figures()["leases reclaimed after the kill"])
    assert int(kill["leases"]) == int(over["leases"]) == reclaimed
    assert 0 < float(over["seconds"]) < 30

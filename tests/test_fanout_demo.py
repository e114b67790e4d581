"""The main job (`make demo`) at a small size, kill included, with its report checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(180)
def test_fanout_survives_a_killed_worker_with_every_job_applied_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fanout.py"), "--jobs", "3000", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "  " in line and not line.startswith(("[", "files"))]
    figures = {name.strip(): value.strip() for name, value in (line.rsplit("  ", 1) for line in lines)}
    assert figures["enqueued"] == "3000"
    assert figures["applied (inbox rows)"] == "3000"
    assert figures["stock (sum of qty)"] == "3000"
    assert int(figures["leases reclaimed after the kill"]) >= 1
    assert figures["dead"] == "0"
    assert "every job applied exactly once" in done.stdout
    # The files are left for an operator to inspect; the receiver's rows agree with the report.
    assert (tmp_path / "queue.db").exists() and (tmp_path / "inbox.db").exists()

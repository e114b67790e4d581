"""Every example runs: the README's quickstart here (the fan-out demo and the ticket desk have their own tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(60)
def test_quickstart_runs_and_its_job_ends_done(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path / "app.db")],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "shipping {'order': 'order-1', 'qty': 7}" in done.stdout
    assert "status='done'" in done.stdout


def test_the_readme_quickstart_is_the_example() -> None:
    """The README's 15 lines are the example's body, so the example proves the README runs."""
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "quickstart.py").read_text()
    for line in (
        "async with queue.transaction() as tx:  # your rows and the job commit together",
        'await tx.enqueue("ship-order-1", {"order": "order-1", "qty": 7})',
        "pool = Pool(queue, concurrency=4)",
        "@pool.handler()",
        "await pool.run(burst=True)",
    ):
        assert line in readme and line in example, line

"""Every example runs: the README's quickstart here (the fan-out demo and the ticket desk have their own tests)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quickstart(path: Path) -> subprocess.CompletedProcess[str]:
    """``python examples/quickstart.py PATH`` with this checkout's asyncq."""
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=path.parent,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def table_rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite3.connect(path) as con:
        return {
            "orders": con.execute("SELECT * FROM orders").fetchall(),
            "jobs": con.execute("SELECT id, status, attempts FROM asyncq_jobs").fetchall(),
        }


@pytest.mark.timeout(60)
def test_quickstart_runs_and_its_job_ends_done(tmp_path: Path) -> None:
    done = quickstart(tmp_path / "app.db")
    assert done.returncode == 0, done.stderr
    assert "shipping {'order': 'order-1', 'qty': 7}" in done.stdout
    assert "status='done'" in done.stdout
    assert table_rows(tmp_path / "app.db") == {"orders": [("order-1", 7)], "jobs": [("ship-order-1", "done", 1)]}


@pytest.mark.timeout(60)
def test_quickstart_runs_twice_on_the_same_file(tmp_path: Path) -> None:
    """A second run finds its order row and its job: it adds neither again and ships nothing twice."""
    path = tmp_path / "app.db"
    assert quickstart(path).returncode == 0
    again = quickstart(path)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert "shipping" not in again.stdout and "status='done'" in again.stdout
    assert table_rows(path) == {"orders": [("order-1", 7)], "jobs": [("ship-order-1", "done", 1)]}


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


def test_the_readme_quickstart_creates_the_table_it_inserts_into_and_runs_twice() -> None:
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "quickstart.py").read_text()
    for line in (
        'await tx.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, qty INT)")',
        "await tx.execute(\"INSERT OR IGNORE INTO orders VALUES ('order-1', 7)\")",
    ):
        assert line in example, line
        assert line in readme, line


@pytest.mark.timeout(60)
def test_the_postgres_quickstart_runs_twice_and_is_the_readmes(postgres_database: str) -> None:
    """``examples/postgres_quickstart.py`` on a schema of its own: the job ends done with the order row, once."""
    import asyncio

    from postgres_support import execute, new_schema_name, queue_url

    schema = new_schema_name()
    url = queue_url(postgres_database, schema)
    app_url = f"{postgres_database}?search_path={schema}"  # the app's table beside the queue, dropped with it
    argv = [sys.executable, str(ROOT / "examples" / "postgres_quickstart.py"), url, app_url]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    try:
        runs = [subprocess.run(argv, capture_output=True, text=True, timeout=50, env=env) for _ in range(2)]
        assert [run.returncode for run in runs] == [0, 0], runs[0].stderr + runs[1].stderr
        assert "shipping {'order': 'order-1'}" in runs[0].stdout and "status='done'" in runs[0].stdout
        assert "shipping" not in runs[1].stdout and "status='done'" in runs[1].stdout
        rows = asyncio.run(_rows(postgres_database, f"SELECT id, qty FROM {schema}.orders"))
        assert rows == [("order-1", 7)]
    finally:
        asyncio.run(execute(postgres_database, f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "postgres_quickstart.py").read_text()
    for line in (
        "pip install 'asyncq[postgres]'",
        'queue = await Queue.open("postgresql://',
        "async with conn.transaction():  # your own asyncpg connection: the job commits or rolls back with your rows",
        'await queue.enqueue("ship-order-1", {"order": "order-1"}, connection=conn)',
    ):
        assert line in readme, line
    block = next(b for b in readme.split("```python")[1:] if 'Queue.open("postgresql://' in b.split("```")[0])
    for line in block.split("```")[0].strip().splitlines()[2:]:
        assert line.strip().split("  #")[0] in example, line


async def _rows(url: str, statement: str) -> list[tuple[object, ...]]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await conn.fetch(statement)]
    finally:
        await conn.close()


def test_the_readme_tasks_quickstart_is_the_tasks_example() -> None:
    """The README's tasks quick start says what examples/tasks.py runs (tests/test_task_results.py runs it)."""
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "tasks.py").read_text()
    for line in (
        "app = asyncq.App()",
        '@app.task(queue="emails", max_attempts=5, timeout=30.0)',
        "async def send_email(to: str, subject: str, *, urgent: bool = False) -> Receipt:",
        'job = await send_email.defer(queue, to="a@b.example", subject="hi")',
        "app.run_worker(queue, concurrency=16)",
        "receipt = await job.result(timeout=10.0)",
    ):
        assert line in readme and line in example, line


@pytest.mark.timeout(60)
def test_the_postgres_outbox_example_runs_twice_and_is_the_readmes(postgres_database: str) -> None:
    """``examples/postgres_outbox.py`` on a schema of its own: the event goes out once, its effect lands once."""
    import asyncio

    from postgres_support import execute, new_schema_name, queue_url

    schema = new_schema_name()
    url = queue_url(postgres_database, schema)  # the outbox, the inbox and the app's tables: all in the schema
    argv = [
        sys.executable,
        str(ROOT / "examples" / "postgres_outbox.py"),
        url,
        f"{postgres_database}?search_path={schema}",
    ]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    try:
        runs = [subprocess.run(argv, capture_output=True, text=True, timeout=50, env=env) for _ in range(2)]
        assert [run.returncode for run in runs] == [0, 0], runs[0].stderr + runs[1].stderr
        assert "sent=1, stopped='idle'" in runs[0].stdout and "sent=0, stopped='idle'" in runs[1].stdout
        assert "inbox {'applied': 1, 'duplicates': 0, 'conflicts': 0}" in runs[1].stdout
        found = asyncio.run(
            _rows(postgres_database, f"SELECT o.state, s.event FROM {schema}.orders o, {schema}.shipments s")
        )
        assert found == [("paid", "order-1-paid")]
    finally:
        asyncio.run(execute(postgres_database, f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "postgres_outbox.py").read_text()
    blocks = [block.split("```")[0].strip() for block in readme.split("```python")[1:]]
    [block] = [block for block in blocks if block.startswith('outbox = await Outbox.open("postgresql://')]
    [opening, *lines] = block.splitlines()
    assert (
        opening.startswith('outbox = await Outbox.open("postgresql://') and "outbox = await Outbox.open(url)" in example
    )
    for line in lines:
        assert line.strip() in example, line

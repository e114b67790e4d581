"""The driver registry itself (``tests/drivers.py``): the PgBouncer entry really runs without a statement cache, and
a driver defined outside the repository (``ASYNCQ_TEST_DRIVER``) runs the conformance suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conformance.support import T0, enqueue, new
from drivers import DRIVERS, EXTERNAL, POSTGRESQL, POSTGRESQL_PGBOUNCER, SQLITE, Driver, registry

from asyncq.store.postgres.queue_store import PostgresQueueStore

ROOT = Path(__file__).resolve().parents[1]


def test_the_registry_holds_each_driver_once_by_name() -> None:
    assert {"postgresql", "postgresql-pgbouncer", "sqlite"} <= DRIVERS.keys()
    assert all(name == driver.name for name, driver in DRIVERS.items())


@pytest.mark.usefixtures("postgres_database")
@pytest.mark.parametrize(
    ("driver", "cached"),
    [(POSTGRESQL, True), (POSTGRESQL_PGBOUNCER, False)],
    ids=["postgresql", "postgresql-pgbouncer"],
)
async def test_the_pgbouncer_entry_prepares_no_named_statement(tmp_path: Path, driver: Driver, cached: bool) -> None:
    """``?wakeups=poll`` opens its connections with ``statement_cache_size=0``: asyncpg keeps no statement, and the
    server holds no named prepared statement after the store's calls (the default entry holds some: the check
    can tell the two apart). A named statement would not survive PgBouncer's transaction mode."""
    async with driver.fresh(tmp_path) as store:
        assert isinstance(store, PostgresQueueStore)
        await enqueue(store, new("a"))
        await store.stats(T0)
        assert (await store.describe())["wakeups"] == ("listen" if cached else "poll")
        async with store._pool.acquire() as conn:
            assert conn._stmt_cache.get_max_size() == (100 if cached else 0)
            named = await conn.fetchval("SELECT count(*) FROM pg_prepared_statements")
    assert (named > 0) is cached, named


def test_a_driver_spec_that_names_no_driver_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not_a_driver.py").write_text("THING = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="must be module:attribute"):
        registry({EXTERNAL: "not_a_driver"})
    with pytest.raises(ValueError, match="must name a Driver"):
        registry({EXTERNAL: "not_a_driver:THING"})
    assert registry({EXTERNAL: ""}).keys() == {"postgresql", "postgresql-pgbouncer", "sqlite"}


def test_the_conformance_suite_runs_on_a_driver_defined_outside_the_repository(tmp_path: Path) -> None:
    """A module outside the repository names a driver (here the SQLite entry under another name); the suite run
    with ``ASYNCQ_TEST_DRIVER`` runs each test on it too, under its name."""
    assert SQLITE.name == "sqlite"
    (tmp_path / "outside_driver.py").write_text(
        textwrap.dedent("""
            import dataclasses
            from drivers import SQLITE

            DRIVER = dataclasses.replace(SQLITE, name="outside")
        """)
    )
    environ = {**os.environ, EXTERNAL: "outside_driver:DRIVER", "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/conformance/test_enqueue.py",
            "-k",
            "outside",
            "-v",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ran = [line for line in run.stdout.splitlines() if "[outside" in line]
    assert len(ran) >= 10 and all("PASSED" in line for line in ran), run.stdout

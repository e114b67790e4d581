"""The store conformance suite's fixtures: ``store`` is a fresh, empty queue store of each driver of the registry
(``tests/drivers.py``: ``sqlite``, ``postgresql``, ``postgresql-pgbouncer``, and any ``ASYNCQ_TEST_DRIVER`` names),
opened in the test's ``tmp_path`` or a schema of its own, and closed (and dropped) after it.

Every test takes ``store`` (and ``driver`` for the few facts where stores may differ) and runs unchanged on each
(the model: River's ``riverdrivertest.Exercise``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from drivers import DRIVERS, Driver

from asyncq.store.port.queue import QueueStore


@pytest.fixture(scope="session", params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    """Each driver in turn (one value: Hypothesis tests may take it). A driver on a server needs it: its tests skip
    with the reason when it does not answer (fail under ``CI=true``), and run in this run's own database."""
    return DRIVERS[request.param].prepare(request)


@pytest.fixture
async def store(driver: Driver, tmp_path: Path) -> AsyncIterator[QueueStore]:
    """A fresh, empty store of ``driver``, closed after the test."""
    async with driver.fresh(tmp_path) as opened:
        yield opened

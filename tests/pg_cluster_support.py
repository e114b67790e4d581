"""A PostgreSQL cluster a test owns: the helper lives in ``benchmarks/pg_cluster.py`` (the chaos harness starts one
too, and benchmarks import nothing from the tests); this module hands it to the tests under its old name."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.append(BENCHMARKS)

from pg_cluster import SERVER_USER, Cluster, cluster_problem, free_port, running_cluster, server_binaries  # noqa: E402
from rabbit_support import unavailable  # noqa: E402

__all__ = ["SERVER_USER", "Cluster", "cluster", "cluster_problem", "free_port", "running_cluster", "server_binaries"]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A fresh cluster of the test's own on loopback (skip, or fail under CI, where none can be started)."""
    problem = cluster_problem()
    if problem is not None:
        unavailable(problem)
    with running_cluster("127.0.0.1") as started:
        yield started

"""The chaos harness (``benchmarks/chaos.py``) at CI size, as a child process: its verdict and its nemesis.

Three runs, each once for the module (``docs/reliability.md`` has their figures and a longer run's):

- the main run, on each store: 10,000 jobs, 3 worker processes delivering over HTTP to the inbox receiver, 20 s
  of SIGKILLs (a worker holding leases every 200-300 ms, then the receiver too), a worker SIGSTOPped past its
  lease, another while it holds the write lock; then the quiet drain and the checker (40-80 s on 2 shared
  cores). On PostgreSQL (a cluster the harness starts) its kills are shorter, 15 s (about 30 s in all), and
  the nemesis also ends every client backend every 0.5-1 s and crash-restarts the server once in each kill
  phase; the write lock it stops a worker holding is a transaction open (``chaos_pg``);
- a short run with one attempt per job and no stops (8 s of kills, about 15 s): with a single attempt, any
  attempt a kill spends on a job no handler started leaves that job dead, never sent; only a lease claimed for
  a free slot (counted in the claim's commit) that a kill caught before its handler began may do so.

Sizes and seed can be changed: ``ASYNCQ_CHAOS_JOBS``, ``ASYNCQ_CHAOS_DURATION``, ``ASYNCQ_CHAOS_SEED`` (and
``ASYNCQ_CHAOS_PG_JOBS``, ``ASYNCQ_CHAOS_PG_DURATION`` for the PostgreSQL run). Without PostgreSQL's server
binaries the PostgreSQL run is skipped, and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pg_cluster_support import cluster_problem
from rabbit_support import unavailable

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "chaos.py"
SEED = int(os.environ.get("ASYNCQ_CHAOS_SEED", "19"))
JOBS = int(os.environ.get("ASYNCQ_CHAOS_JOBS", "10000"))
DURATION = float(os.environ.get("ASYNCQ_CHAOS_DURATION", "20"))
PG_JOBS = int(os.environ.get("ASYNCQ_CHAOS_PG_JOBS", "10000"))
PG_DURATION = float(os.environ.get("ASYNCQ_CHAOS_PG_DURATION", "15"))
SIZES = {"sqlite": (JOBS, DURATION), "postgresql": (PG_JOBS, PG_DURATION)}
LEASE_MS = 1000

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240 + int(DURATION) * 3)]


def run_chaos(folder: Path, *options: str) -> tuple[int, dict[str, Any]]:
    """Run the harness in ``folder``; its exit code and the JSON line it printed last."""
    command = [sys.executable, str(SCRIPT), "--dir", str(folder), "--lease-ms", str(LEASE_MS), *options]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # A session of its own: on a timeout, its whole process group (workers, fork server, receiver) is killed.
    harness = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder, env=env, start_new_session=True
    )
    try:
        stdout, stderr = harness.communicate(timeout=200 + DURATION * 3)
    except subprocess.TimeoutExpired:
        os.killpg(harness.pid, signal.SIGKILL)
        stdout, stderr = harness.communicate()
        raise AssertionError(f"the harness ran past its timeout:\n{stderr[-3000:]}") from None
    lines = stdout.strip().splitlines()
    assert lines, f"the harness printed nothing (exit {harness.returncode}):\n{stderr[-3000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    print(f"\n{' '.join(command[1:])}\n{lines[-1]}")
    return harness.returncode, report


@pytest.fixture(scope="module", params=sorted(SIZES, reverse=True))  # every store (chaos_store.STORES)
def main_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    store: str = request.param
    if store == "postgresql" and (problem := cluster_problem()) is not None:
        unavailable(problem)
    jobs, duration = SIZES[store]
    options = ["--seed", str(SEED), "--jobs", str(jobs), "--workers", "3", "--duration", str(duration)]
    return run_chaos(tmp_path_factory.mktemp(f"chaos-{store}"), *options, "--store", store)


@pytest.fixture(scope="module")
def one_attempt_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    options = ["--seed", str(SEED), "--jobs", "5000", "--workers", "3", "--duration", "8", "--max-attempts", "1"]
    return run_chaos(tmp_path_factory.mktemp("chaos1"), *options, "--stop-past-lease", "0", "--stop-holding-lock", "0")


def assert_nothing_lost_duplicated_unexpected_or_left(code: int, report: dict[str, Any]) -> None:
    figures = {name: report[name] for name in ("lost", "duplicated", "unexpected", "non_terminal")}
    assert figures == {"lost": 0, "duplicated": 0, "unexpected": 0, "non_terminal": 0}, report
    assert report["integrity"] == {"queue": "ok", "inbox": "ok"}
    assert report["failed"] == [] and code == 0
    assert report["done"] + report["dead"] == report["jobs"] == sum(report["dead_by_reason"].values()) + report["done"]
    assert report["drain_s"] is not None  # drained within the timeout: nothing stuck


def test_chaos_loses_nothing_applies_nothing_twice_and_leaves_nothing_unfinished(
    main_run: tuple[int, dict[str, Any]], record_property: pytest.RecordProperty
) -> None:
    code, report = main_run
    for name in ("kills", "redeliveries", "duplicates_absorbed", "dead", "dead_never_started", "drain_s"):
        record_property(name, report[name])
    assert report["jobs"] == SIZES[report["store"]][0]
    assert_nothing_lost_duplicated_unexpected_or_left(code, report)
    assert report["unexpected_by_kind"] == {}
    assert report["unclean_stops"] == []


def test_the_nemesis_really_killed_and_stopped_processes_that_held_work(main_run: tuple[int, dict[str, Any]]) -> None:
    _code, report = main_run
    # A kill every 200-300 ms (skipped when no worker holds a lease: on a loaded machine, many are starting).
    assert report["kills"] + report["kills_skipped"] >= report["duration"] / 0.3 * 0.5
    assert report["kills"] >= 3 and report["receiver_kills"] >= 2
    assert all(jobs > 0 for jobs in report["backlog"].values()), report["backlog"]  # each step had work to hit
    assert report["orphaned_by_kills"] > 0
    recovery = report["recovery_ms"]
    assert recovery["reclaimed"] > 0 and recovery["unresolved"] == 0
    assert 0 < recovery["p50"] <= recovery["p99"] and recovery["p50"] < 5 * LEASE_MS  # taken back, and soon
    past_lease, holding_lock = report["stops"]
    assert past_lease["kind"] == "past_lease" and past_lease["leases"] > 0
    assert past_lease["seconds"] > LEASE_MS / 1000
    assert holding_lock["kind"] == "holding_write_lock" and holding_lock["verified"] is True
    # What the faults must have caused: deliveries repeated (the inbox absorbed them), and the worker stopped
    # past its lease found its leases taken when it resumed.
    assert report["redeliveries"] > 0 and report["duplicates_absorbed"] > 0
    assert report["stale_finishes_rejected"] + report["leases_lost"] > 0
    assert report["enqueue_during_stop"]["during"] == "holding_write_lock"


def test_no_worker_exits_while_another_is_stopped_holding_the_write_lock(main_run: tuple[int, dict[str, Any]]) -> None:
    _code, report = main_run
    holding_lock = report["stops"][-1]
    assert holding_lock["kind"] == "holding_write_lock"
    assert holding_lock["self_exits_meanwhile"] == 0, report["self_exit_causes"]


@pytest.mark.parametrize("main_run", ["postgresql"], indirect=True)  # the server faults are PostgreSQL's
def test_on_postgresql_the_server_was_crash_restarted_and_its_backends_ended_and_no_worker_died(
    main_run: tuple[int, dict[str, Any]],
) -> None:
    _code, report = main_run
    assert report["server_restarts"] == 2 and report["restarts_skipped"] is None  # once in each kill phase
    assert report["backend_terminations"] >= report["duration"] / 1.0 * 0.5 and report["backends_ended"] > 0
    assert report["self_exits"] == 0, report["self_exit_causes"]  # a lost connection is a fault, not an exit


def test_the_one_attempt_run_is_correct_and_killed_workers_that_held_jobs(
    one_attempt_run: tuple[int, dict[str, Any]],
) -> None:
    code, report = one_attempt_run
    assert_nothing_lost_duplicated_unexpected_or_left(code, report)
    assert report["kills"] > 0 and report["orphaned_by_kills"] > 0
    assert report["recovery_ms"]["swept_dead"] > 0  # one attempt: an orphaned job is not claimed again


def test_a_sigkill_spends_no_attempt_of_a_job_claimed_ahead(one_attempt_run: tuple[int, dict[str, Any]]) -> None:
    """A pool counts the attempt of a job claimed for a free slot in the claim's commit, so a kill between that
    commit and the handler's first step spends it (the window is one turn of the event loop; on two busy cores
    the nemesis lands in it now and then). A job claimed ahead into the buffer is counted only once a handler
    starts it. With one attempt a job, every attempt spent without a start must be one of the counted leases a
    kill caught unstarted, and each leaves its job dead with no counted start (a start a kill caught before the
    commit that counts it spent nothing): nothing else may spend one."""
    _code, report = one_attempt_run
    caught = report["counted_leases_killed_before_start"]
    # A start a kill caught before it was counted spent nothing (the job was claimed again): not a start here.
    assert report["attempts_without_start"] == caught, report["caught_leases"]
    assert report["dead_without_counted_start"] == caught
    assert caught <= report["kills"] * 8  # at most one claim's free slots (8 tasks a worker) a kill

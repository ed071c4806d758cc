"""End to end, `make chaos` at small scale, in each variant: 150 tasks through a
private stack with 2 replicas of each service (the dispatchers behind the run's round-robin
balancer) while the SQS fault injector loses, duplicates and fails messages, single replicas and
wrappers get SIGKILL and Postgres restarts in immediate mode; no task is lost, none is completed
twice, no attempts overlap, counted from the database and from the operators' own record. Without
waiting claims every completed task was claimed from a wake-up SQS delivered; with claims ahead
(and no waiting claim) every one came from SQS or was claimed ahead.

The run is the one `make chaos` runs (`taskplat.chaos.run`), in this process, against the
session's SQS endpoint; its seed is printed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from taskplat.chaos.config import (
    CLAIMS_AHEAD,
    NO_WAITING_CLAIMS,
    WAITING_CLAIMS,
    ChaosConfig,
)
from taskplat.chaos.injector import FaultRates
from taskplat.chaos.report import report
from taskplat.chaos.run import ChaosRun
from taskplat.chaos.verdict import ChaosResult

pytestmark = pytest.mark.e2e

TASKS = 150


def _run(sqs_endpoint_url: str, run_dir: Path, *, variant: str) -> ChaosResult:
    seed = random.randrange(1 << 30)
    config = ChaosConfig(
        run_dir=run_dir,
        tasks=TASKS,
        fault_seconds=15.0,
        drain_seconds=120.0,
        # Higher rates than the default run's, so that every kind happens at this size.
        rates=FaultRates(lose=0.15, duplicate=0.15, fail_receive=0.15, fail_delete=0.15),
        kill_every=2.0,  # a 15 s window without a kill: p < 0.001
        postgres_restarts=1,
        workers=2,
        replicas=2,
        variant=variant,
        seed=seed,
        sqs_endpoint_url=sqs_endpoint_url,
    )
    result = ChaosRun(config, say=print).run()
    print(report(result, config))
    assert result.verdict.ok, result.verdict
    assert result.queue_empty
    assert result.postgres_restarts == 1
    assert sum(result.kills.values()) >= 1, result.kills
    assert result.injected.get("lost", 0) > 0 and result.injected.get("duplicated", 0) > 0
    assert result.runs_recorded >= TASKS
    # Both dispatcher replicas served requests, and every completion's claim went through the
    # balancer (so its source is known).
    served = [k for k in result.balancer if k.startswith("requests to ")]
    assert len(served) == 2, result.balancer
    assert sum(result.completed_by_source.values()) == TASKS
    assert result.completed_by_source["unknown"] == 0, result.completed_by_source
    return result


def test_a_small_chaos_run_with_two_replicas_loses_nothing_and_completes_nothing_twice(
    sqs_endpoint_url: str, tmp_path: Path
) -> None:
    _run(sqs_endpoint_url, tmp_path / "chaos", variant=WAITING_CLAIMS)


def test_without_waiting_claims_every_task_goes_through_the_faulty_sqs(
    sqs_endpoint_url: str, tmp_path: Path
) -> None:
    result = _run(sqs_endpoint_url, tmp_path / "chaos", variant=NO_WAITING_CLAIMS)

    assert result.completed_by_source["sqs"] == TASKS, result.completed_by_source
    assert result.claims_by_source["waiting_claim"] == 0
    assert result.claims_by_source["claim_ahead"] == 0
    assert result.wakeups_received >= TASKS
    assert result.injected.get("failed_receives", 0) > 0


def test_with_claims_ahead_and_no_waiting_claim_nothing_is_lost_or_done_twice(
    sqs_endpoint_url: str, tmp_path: Path
) -> None:
    result = _run(sqs_endpoint_url, tmp_path / "chaos", variant=CLAIMS_AHEAD)

    by_source = result.completed_by_source
    assert by_source["sqs"] + by_source["claim_ahead"] == TASKS, by_source
    assert result.claims_by_source["waiting_claim"] == 0

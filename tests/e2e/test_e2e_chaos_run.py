"""End to end, `make chaos` at small scale: 250 tasks through a private stack while the SQS fault
injector loses, duplicates and fails messages, services get SIGKILL and Postgres restarts in
immediate mode; no task is lost, none is completed twice, no attempts overlap, counted from the
database and from the operators' own record.

The run is the one `make chaos` runs (`taskplat.devstack.chaos.run`), in this process, against the
session's SQS endpoint; its seed is printed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from taskplat.devstack.chaos.injector import FaultRates
from taskplat.devstack.chaos.run import ChaosConfig, ChaosRun, report

pytestmark = pytest.mark.e2e


def test_a_small_chaos_run_loses_nothing_and_completes_nothing_twice(
    sqs_endpoint_url: str, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    config = ChaosConfig(
        run_dir=tmp_path / "chaos",
        tasks=250,
        fault_seconds=20.0,
        drain_seconds=90.0,
        # Higher rates than the default run's, so that every kind happens at this size.
        rates=FaultRates(lose=0.15, duplicate=0.15, fail_receive=0.15, fail_delete=0.15),
        kill_every=3.0,
        postgres_restarts=1,
        workers=2,
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
    assert result.runs_recorded >= 250

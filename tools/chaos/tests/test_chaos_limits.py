"""The chaos run's queue limits: the body it sets, the keys it spreads over its tasks, and the
check from the attempts' own times that names each limit exceeded (and fails the verdict)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskplat.chaos.config import ChaosConfig
from taskplat.chaos.limits import ChaosLimits, check
from taskplat.chaos.report import report
from taskplat.chaos.verdict import ChaosResult, Verdict
from taskplat.devstack.errors import DevstackError


def _row(key: str, started: float, finished: float | None) -> dict[str, object]:
    return {"concurrency_key": key, "started": started, "finished": finished}


def test_the_limits_body_and_keys() -> None:
    assert not ChaosLimits().any and ChaosLimits().key_of(3) is None
    limits = ChaosLimits(concurrency_limit=3, rate_per_second=5.0, rate_burst=2, keys=2)
    assert limits.any
    assert limits.body() == {"concurrency_limit": 3, "key_concurrency_limit": None,
                             "rate_limit": {"per_second": 5.0, "burst": 2}}  # fmt: skip
    assert [limits.key_of(n) for n in range(3)] == ["key-0", "key-1", "key-0"]
    with pytest.raises(DevstackError):
        ChaosLimits(rate_per_second=5.0)


def test_the_check_names_each_limit_exceeded() -> None:
    limits = ChaosLimits(concurrency_limit=2, key_concurrency_limit=1, rate_per_second=1.0,
                         rate_burst=2, keys=2)  # fmt: skip
    held = [_row("key-0", 0, 1), _row("key-1", 0, 1), _row("key-0", 1, 2), _row("key-1", 2, None)]
    use, exceeded = check(limits, held)
    assert exceeded == []
    assert use["max_running"] == 2 and use["max_running_per_key"] == {"key-0": 1, "key-1": 1}
    over = [*held, _row("key-0", 0.5, 0.8)]
    use, exceeded = check(limits, over)
    assert use["max_running"] == 3
    assert len(exceeded) == 3  # the queue, key-0 and the bucket (3 starts in [0, 0.5]: 2 + 0.5)
    assert any("key 'key-0'" in line for line in exceeded)


def test_an_exceeded_limit_fails_the_verdict_and_shows_in_the_report(tmp_path: Path) -> None:
    verdict = Verdict(limits_exceeded=["3 Running at once, limit 2"])
    assert not verdict.ok
    result = ChaosResult(seed=1, tasks=5, verdict=verdict, injected={}, sqs_requests={},
                         kills={}, postgres_restarts=0, attempt_outcomes={}, runs_recorded=5,
                         tasks_run_more_than_once=0, submit_seconds=1.0, drain_seconds=2.0,
                         queue_empty=True,
                         limits_use={"set": {"concurrency_limit": 2},
                                     "max_running": 3})  # fmt: skip
    text = report(result, ChaosConfig(run_dir=tmp_path))
    assert "queue limits {'concurrency_limit': 2}: measured {'max_running': 3}" in text
    assert "limits_exceeded: 3 Running at once, limit 2" in text
    assert text.endswith("FAIL")

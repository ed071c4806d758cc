"""The chaos run's queue limits: the body of `PUT /queues/{queue}` set before the faults, and the
check, from the database's own attempt times, that no limit was ever exceeded
(docs/queue-limits.md).

Invariants: only reads what it is given; a run without limits checks nothing and reports none;
an attempt without an end (still Running) counts as Running to the end of the check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.flow_checks import RATE_SLACK, max_running, rate_excess
from taskplat.devstack.waiting import wait_for


@dataclass(frozen=True)
class ChaosLimits:
    """Limits set on the chaos queue; `keys` concurrency keys are spread over its tasks."""

    concurrency_limit: int | None = None
    key_concurrency_limit: int | None = None
    rate_per_second: float | None = None
    rate_burst: int | None = None
    keys: int = 0

    def __post_init__(self) -> None:
        if (self.rate_per_second is None) != (self.rate_burst is None):
            raise DevstackError("--rate and --burst go together")
        if self.keys < 0:
            raise DevstackError("--keys must be 0 or more")

    @property
    def any(self) -> bool:
        return any(
            value is not None
            for value in (self.concurrency_limit, self.key_concurrency_limit, self.rate_per_second)
        )

    def body(self) -> dict[str, Any]:
        rate = (
            {"per_second": self.rate_per_second, "burst": self.rate_burst}
            if self.rate_per_second is not None
            else None
        )
        return {
            "concurrency_limit": self.concurrency_limit,
            "key_concurrency_limit": self.key_concurrency_limit,
            "rate_limit": rate,
        }

    def key_of(self, n: int) -> str | None:
        """The concurrency key of the run's task number `n` (none without `keys`)."""
        return f"key-{n % self.keys}" if self.keys else None


def check(limits: ChaosLimits, rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """What the attempts `rows` (concurrency_key, started, finished) used of each limit, and a
    line for each limit exceeded."""
    spans = [(row["started"], row["finished"]) for row in rows]
    by_key: dict[str, list[tuple[float, float | None]]] = {}
    for row in rows:
        by_key.setdefault(row["concurrency_key"], []).append((row["started"], row["finished"]))
    use: dict[str, Any] = {"set": limits.body(), "attempts": len(rows)}
    exceeded: list[str] = []
    if limits.concurrency_limit is not None:
        peak = max_running(spans)
        use["max_running"] = peak
        if peak > limits.concurrency_limit:
            exceeded.append(f"{peak} Running at once, limit {limits.concurrency_limit}")
    if limits.key_concurrency_limit is not None:
        peaks = {key: max_running(key_spans) for key, key_spans in sorted(by_key.items())}
        use["max_running_per_key"] = peaks
        exceeded += [
            f"key {key!r}: {peak} Running at once, limit {limits.key_concurrency_limit}"
            for key, peak in peaks.items()
            if peak > limits.key_concurrency_limit
        ]
    if limits.rate_per_second is not None and limits.rate_burst is not None:
        excess = rate_excess([s for s, _ in spans], limits.rate_per_second, limits.rate_burst)
        use["starts_over_the_bucket"] = round(max(excess, 0.0), 3)
        if excess > RATE_SLACK:
            exceeded.append(
                f"{excess:.1f} starts beyond burst {limits.rate_burst} + "
                f"{limits.rate_per_second:g}/s x t in some window"
            )
    return use, exceeded


def set_on_queue(limits: ChaosLimits, url: str, api_key: str) -> None:
    """Set the run's limits on its queue (`PUT /queues/default`), before any task exists;
    retried while the dispatcher is not up yet (no answer, or a 5xx)."""
    body = limits.body()
    headers = {"Authorization": f"Bearer {api_key}"}

    def attempt() -> bool:
        try:
            response = httpx.put(f"{url}/queues/default", json=body, headers=headers)
        except httpx.TransportError:
            return False
        if response.status_code >= 500:
            return False
        if response.status_code not in (200, 201):
            raise DevstackError(f"PUT /queues/default: {response.status_code} {response.text}")
        return True

    wait_for(attempt, timeout=60, what="PUT /queues/default to set the limits", interval=0.2)

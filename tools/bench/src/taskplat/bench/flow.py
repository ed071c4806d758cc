"""W7 (flow control, docs/queue-limits.md): three parts on the main stack's queue.

1. Limits that never bind: W1's drain with a concurrency, a key and a rate limit set far above
   what the stack can reach; `drain_ratio_to_W1` (same variant, same run) is its cost.
2. A skewed load of several concurrency keys under a key limit: one key queues most tasks
   first, the others after it; the `hold` operator keeps each task Running a while so the limit
   can bind. Reported: each key's share of the starts while every key still had work (fair:
   1/keys each), and the most tasks of one key Running at once, measured from the attempts' own
   `started_at` and `finished_at` (`key_limit_held`: never more than the limit).
3. A rate-limited queue: tasks submitted at once; the starts' rate and whether any window of t
   seconds held more than `burst + per_second x t` starts (`rate_held`: none did).

Invariants:
- Every limit W7 sets is cleared again however the part ends, so later workloads run without.
- Concurrency and rates come from the database's own times of each attempt, never sampled.
- A part the dispatcher cannot run (no `concurrency_key` on task creation) is reported as not
  measured with the reason, not guessed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from taskplat.bench.client import BenchError, Submitted, submit_tasks
from taskplat.bench.config import Sizes
from taskplat.bench.harness import BenchStack
from taskplat.bench.throughput import measure_throughput, submit_and_drain
from taskplat.devstack.flow_checks import (
    RATE_SLACK,
    max_running,
    rate_excess,
    shares_while_all_busy,
)

QUEUE = "default"
# Limits far above anything the bench stack reaches (the API's maxima for the counts).
UNBINDING = {
    "concurrency_limit": 1_000_000,
    "key_concurrency_limit": 1_000_000,
    "rate_limit": {"per_second": 1_000_000.0, "burst": 100_000},
}


@contextmanager
def queue_limits(bs: BenchStack, limits: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Set the queue's limits for the block; clear them after, however it ends."""
    url = f"{bs.dispatcher_url}/queues/{QUEUE}"
    answer = httpx.put(url, json=limits, headers=bs.headers, timeout=30)
    if answer.status_code != 200:
        raise BenchError(f"PUT /queues/{QUEUE} answered {answer.status_code}: {answer.text}")
    try:
        yield answer.json()
    finally:
        httpx.put(url, json={}, headers=bs.headers, timeout=30).raise_for_status()


def takes_concurrency_keys(bs: BenchStack) -> bool:
    """Whether the dispatcher's task creation contract has `concurrency_key`."""
    document = httpx.get(f"{bs.dispatcher_url}/openapi.json", timeout=10).json()
    schema = document.get("components", {}).get("schemas", {}).get("CreateTaskRequest", {})
    return "concurrency_key" in schema.get("properties", {})


def _submit(bs: BenchStack, sizes: Sizes, bodies: list[dict[str, Any]], label: str) -> Submitted:
    def submit(
        on_done: Callable[[int], None], stop: threading.Event
    ) -> Coroutine[Any, Any, Submitted]:
        return submit_tasks(
            bs.dispatcher_url, bs.headers, bodies, in_flight=sizes.in_flight,
            on_done=on_done, stop=stop,
        )  # fmt: skip

    bs.wait_idle()
    return submit_and_drain(bs, len(bodies), submit, label)


def measure_unbinding(
    bs: BenchStack, sizes: Sizes, batch_path: str | None, label: str
) -> dict[str, Any]:
    """Part 1: W1's drain with limits set that never bind."""
    with queue_limits(bs, UNBINDING):
        figures = measure_throughput(bs, sizes, batch_path, f"{label} unbinding limits")
    keep = ("tasks", "submit_rate", "drain_rate", "drain_seconds", "exactly_once")
    return {key: figures[key] for key in keep}


def skewed_bodies(sizes: Sizes) -> list[dict[str, Any]]:
    """The hot key's tasks first (`w7_hot_share` of them), then the other keys' interleaved."""
    n, keys = sizes.w7_key_tasks, sizes.w7_keys
    hot = int(n * sizes.w7_hot_share)
    config = {"seconds": sizes.w7_hold_seconds}
    order = ["key-0"] * hot + [f"key-{1 + i % (keys - 1)}" for i in range(n - hot)]
    return [{"operator": "hold", "config": config, "concurrency_key": key} for key in order]


def measure_keys(bs: BenchStack, sizes: Sizes, label: str) -> dict[str, Any]:
    """Part 2: the skewed multi-key load under `w7_key_limit` per key."""
    if not takes_concurrency_keys(bs):
        return {"measured": False,
                "reason": "the dispatcher's POST /tasks takes no concurrency_key"}  # fmt: skip
    limit = sizes.w7_key_limit
    with queue_limits(bs, {"key_concurrency_limit": limit}):
        submitted = _submit(bs, sizes, skewed_bodies(sizes), f"{label} keys")
    rows = bs.query("attempt_intervals", ids=submitted.task_ids)
    by_key: dict[str, list[tuple[float, float | None]]] = {}
    for row in rows:
        by_key.setdefault(row["concurrency_key"], []).append((row["started"], row["finished"]))
    peaks = {key: max_running(spans) for key, spans in sorted(by_key.items())}
    shares = shares_while_all_busy([(r["concurrency_key"], r["started"]) for r in rows])
    return {
        "measured": True,
        "tasks": len(submitted.task_ids),
        "keys": sizes.w7_keys,
        "key_limit": limit,
        "hot_share_of_tasks": sizes.w7_hot_share,
        "share_of_starts_while_all_have_work": shares,
        "fair_share": round(1 / sizes.w7_keys, 3),
        "max_running_per_key": peaks,
        "max_running_of_a_key": max(peaks.values(), default=0),
        # True when no key ever had more than `limit` Running (all runs must hold it).
        "key_limit_held": all(peak <= limit for peak in peaks.values()),
    }


def measure_rate(bs: BenchStack, sizes: Sizes, label: str) -> dict[str, Any]:
    """Part 3: `w7_rate_tasks` tasks at once on a queue limited to `w7_rate` starts a second."""
    rate, burst = sizes.w7_rate, sizes.w7_burst
    limits = {"rate_limit": {"per_second": rate, "burst": burst}}
    bodies = [{"operator": "noop"} for _ in range(sizes.w7_rate_tasks)]
    with queue_limits(bs, limits):
        submitted = _submit(bs, sizes, bodies, f"{label} rate")
    starts = [row["started"] for row in bs.query("attempt_intervals", ids=submitted.task_ids)]
    span = max(starts) - min(starts) if len(starts) > 1 else 0.0
    excess = rate_excess(starts, rate, burst)
    return {
        "tasks": len(starts),
        "limit_per_second": rate,
        "burst": burst,
        # Beyond the burst, the starts' own rate: (n - burst) over the span of the starts.
        "starts_per_second": round(max(len(starts) - burst, 0) / span, 2) if span else None,
        "most_starts_over_the_bucket": round(max(excess, 0.0), 3),
        # True when no window held more than the bucket allows (all runs must hold it).
        "rate_held": excess <= RATE_SLACK,
    }


def measure_flow(
    bs: BenchStack, sizes: Sizes, batch_path: str | None, label: str
) -> dict[str, Any]:
    """One run of W7: its three parts."""
    return {
        "unbinding": measure_unbinding(bs, sizes, batch_path, label),
        "keys": measure_keys(bs, sizes, label),
        "rate": measure_rate(bs, sizes, label),
    }

"""The chaos run's report: the text of one variant's result, and the table comparing variants.

Invariants: only formats what it is given; the verdict's lists are cut to ten names each.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from taskplat.chaos.config import ChaosConfig
from taskplat.chaos.injector import FaultRates
from taskplat.chaos.verdict import ChaosResult


def rates_text(rates: FaultRates) -> str:
    return (
        f"lose {rates.lose:.0%}, duplicate {rates.duplicate:.0%}, "
        f"fail receive {rates.fail_receive:.0%}, fail delete {rates.fail_delete:.0%}"
    )


def report(result: ChaosResult, config: ChaosConfig) -> str:
    v = result.verdict
    injected = result.injected
    kills = ", ".join(f"{name} {n}" for name, n in sorted(result.kills.items())) or "none"
    outcomes = ", ".join(f"{k} {n}" for k, n in sorted(result.attempt_outcomes.items()))
    drained = f"{result.drain_seconds}s" if result.drain_seconds is not None else "not reached"
    by_source = result.completed_by_source
    lines = [
        f"chaos run ({result.variant}): {result.tasks} tasks, seed {result.seed}, faults for "
        f"{config.fault_seconds:g}s ({rates_text(config.rates)}), {config.workers} workers, "
        f"{result.replicas} replicas of each service",
        "settings: " + ", ".join(f"{k}={v}" for k, v in result.settings.items()),
        f"injected: {injected.get('lost', 0)} messages lost, "
        f"{injected.get('duplicated', 0)} duplicated, "
        f"{injected.get('failed_receives', 0)} receives and "
        f"{injected.get('failed_deletes', 0)} deletes failed",
        "SQS requests during the faults: "
        + ", ".join(f"{name} {n}" for name, n in sorted(result.sqs_requests.items())),
        f"SIGKILLs: {kills}; Postgres immediate restarts: {result.postgres_restarts}",
        "SIGKILLs per process: "
        + (", ".join(f"{n} {k}" for n, k in sorted(result.kills_by_process.items())) or "none"),
        "dispatcher balancer: " + ", ".join(f"{k} {n}" for k, n in sorted(result.balancer.items())),
        f"submitted in {result.submit_seconds}s; every task Completed {drained} after the "
        f"faults stopped; task queue empty at the end: {'yes' if result.queue_empty else 'no'}",
        f"attempts: {outcomes}; operator runs recorded: {result.runs_recorded} "
        f"({result.tasks_run_more_than_once} tasks run more than once, allowed)",
        f"completed tasks claimed from an SQS wake-up {by_source.get('sqs', 0)}, by a waiting "
        f"claim {by_source.get('waiting_claim', 0)}, ahead {by_source.get('claim_ahead', 0)}, "
        f"unknown {by_source.get('unknown', 0)}; wake-ups SQS delivered: "
        f"{result.wakeups_received}",
        "",
        f"{'':34}{'database':>10}{'operators':>11}",
        f"{'tasks lost':34}{len(v.lost_db):>10}{len(v.lost_records):>11}",
        f"{'tasks completed twice':34}{len(v.completed_twice_db):>10}"
        f"{len(v.completed_twice_records):>11}",
        f"{'attempts that overlapped':34}{len(v.overlapped_db):>10}{len(v.overlapped_records):>11}",
        f"{'completions no operator recorded':34}{len(v.unrecorded_completions):>10}{'':>11}",
    ]
    if result.limits_use:
        use = {k: value for k, value in result.limits_use.items() if k != "set"}
        lines.insert(-6, f"queue limits {result.limits_use['set']}: measured {use}")
        lines.append(f"{'queue limits exceeded':34}{len(v.limits_exceeded):>10}{'':>11}")
    for note in result.notes:
        lines.append(f"note: {note}")
    for name, items in asdict(v).items():
        if items:
            lines.append(f"{name}: {', '.join(items[:10])}{' ...' if len(items) > 10 else ''}")
    lines.append(f"result ({result.variant}): " + ("PASS" if v.ok else "FAIL"))
    return "\n".join(lines)


def comparison(results: list[ChaosResult]) -> str:
    """One column per variant: the verdict (database/operators) and the paths the tasks took."""

    def both(db: list[str], records: list[str]) -> str:
        return f"{len(db)}/{len(records)}"

    rows: list[tuple[str, list[str]]] = [
        ("tasks (replicas of each service)", [f"{r.tasks} ({r.replicas})" for r in results]),
        (
            "tasks lost (db/operators)",
            [both(r.verdict.lost_db, r.verdict.lost_records) for r in results],
        ),
        (
            "completed twice (db/operators)",
            [
                both(r.verdict.completed_twice_db, r.verdict.completed_twice_records)
                for r in results
            ],
        ),
        (
            "overlaps (db/operators)",
            [both(r.verdict.overlapped_db, r.verdict.overlapped_records) for r in results],
        ),
        ("unrecorded completions", [str(len(r.verdict.unrecorded_completions)) for r in results]),
        (
            "queue limits exceeded",
            [str(len(r.verdict.limits_exceeded)) if r.limits_use else "unset" for r in results],
        ),
    ]
    for source, label in (
        ("sqs", "completed via an SQS wake-up"),
        ("waiting_claim", "completed via a waiting claim"),
        ("claim_ahead", "completed via a claim ahead"),
        ("unknown", "completed via unknown"),
    ):
        rows.append((label, [str(r.completed_by_source.get(source, 0)) for r in results]))
    rows += [
        ("wake-ups SQS delivered", [str(r.wakeups_received) for r in results]),
        (
            "SQS sends lost/duplicated",
            [f"{r.injected.get('lost', 0)}/{r.injected.get('duplicated', 0)}" for r in results],
        ),
        (
            "SIGKILLs / Postgres restarts",
            [f"{sum(r.kills.values())}/{r.postgres_restarts}" for r in results],
        ),
        ("result", ["PASS" if r.verdict.ok else "FAIL" for r in results]),
    ]
    width = max(20, *(len(r.variant) + 2 for r in results))
    lines = [f"{'':34}" + "".join(f"{r.variant:>{width}}" for r in results)]
    lines += [
        f"{label:34}" + "".join(f"{cell:>{width}}" for cell in cells) for label, cells in rows
    ]
    return "\n".join(lines)


def config_json(config: ChaosConfig) -> dict[str, Any]:
    data = asdict(config)
    data["run_dir"] = str(config.run_dir)
    return data

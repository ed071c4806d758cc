"""What went wrong in a chaos run, counted two ways: from the database and from the operators'
own record file (`recording_operator.py` appends `task_id attempt start end pid` per run).

Invariants: `judge` only reads (the database through `db(query name)`, the records as given);
running a task to the end more than once is counted, not an error (at-least-once execution).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from taskplat.chaos.config import WAITING_CLAIMS


@dataclass
class Verdict:
    """What went wrong, from the database and from the operators' records."""

    lost_db: list[str] = field(default_factory=list)
    lost_records: list[str] = field(default_factory=list)
    completed_twice_db: list[str] = field(default_factory=list)
    completed_twice_records: list[str] = field(default_factory=list)
    overlapped_db: list[str] = field(default_factory=list)
    overlapped_records: list[str] = field(default_factory=list)
    unrecorded_completions: list[str] = field(default_factory=list)
    # Each queue limit exceeded, measured from the attempts' own times (limits.py).
    limits_exceeded: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(asdict(self).values())


@dataclass
class ChaosResult:
    seed: int
    tasks: int
    verdict: Verdict
    injected: dict[str, int]
    sqs_requests: dict[str, int]  # during the fault window
    kills: dict[str, int]
    postgres_restarts: int
    attempt_outcomes: dict[str, int]
    runs_recorded: int
    tasks_run_more_than_once: int
    submit_seconds: float
    drain_seconds: float | None
    queue_empty: bool
    variant: str = WAITING_CLAIMS
    replicas: int = 1
    # How each task's completed attempt was claimed (CLAIM_SOURCES), from the balancer's record.
    completed_by_source: dict[str, int] = field(default_factory=dict)
    claims_by_source: dict[str, int] = field(default_factory=dict)  # every claim answered
    wakeups_received: int = 0  # messages SQS delivered to the wrappers, the whole run
    balancer: dict[str, int] = field(default_factory=dict)  # requests per replica, 502s
    kills_by_process: dict[str, int] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # the variant's notable settings
    limits_use: dict[str, Any] = field(default_factory=dict)  # the limits set and their peaks
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_records(path: Path) -> list[tuple[str, int, float, float, int]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            rows.append((parts[0], int(parts[1]), float(parts[2]), float(parts[3]), int(parts[4])))
    return rows


def judge(
    records: list[tuple[str, int, float, float, int]],
    task_ids: set[str],
    db: Callable[[str], list[dict[str, Any]]],
) -> tuple[Verdict, int]:
    """The verdict from the database (`db(query name)`) and the operators' records; also how
    many tasks were run to the end more than once (at-least-once execution, not an error)."""
    verdict = Verdict()
    verdict.lost_db = sorted(
        {row["task_id"] for row in db("not_completed")} | (task_ids - _all_tasks(db))
    )
    verdict.completed_twice_db = sorted(row["task_id"] for row in db("completed_twice"))
    verdict.overlapped_db = sorted(
        f"{row['task_id']} attempts {row['earlier']}/{row['later']}"
        for row in db("overlapping_attempts")
    )
    runs: dict[str, list[tuple[int, float, float, int]]] = defaultdict(list)
    for task_id, attempt, start, end, pid in records:
        runs[task_id].append((attempt, start, end, pid))
    verdict.lost_records = sorted(task_ids - set(runs))
    per_attempt = Counter((task_id, attempt) for task_id, attempt, *_ in records)
    verdict.completed_twice_records = sorted(
        f"{task_id} attempt {attempt}" for (task_id, attempt), n in per_attempt.items() if n > 1
    )
    for task_id, task_runs in runs.items():
        ordered = sorted(task_runs, key=lambda run: run[1])
        latest = ordered[0]  # the run that ends last among those started so far
        for run in ordered[1:]:
            if run[1] < latest[2]:
                verdict.overlapped_records.append(f"{task_id} attempts {latest[0]}/{run[0]}")
            if run[2] > latest[2]:
                latest = run
    completed = {(row["task_id"], row["attempt"]) for row in db("completed_attempts")}
    verdict.unrecorded_completions = sorted(
        f"{task_id} attempt {attempt}"
        for task_id, attempt in completed
        if (task_id, attempt) not in per_attempt
    )
    rerun = sum(1 for task_runs in runs.values() if len(task_runs) > 1)
    return verdict, rerun


def _all_tasks(db: Callable[[str], list[dict[str, Any]]]) -> set[str]:
    return {row["task_id"] for row in db("task_ids")}

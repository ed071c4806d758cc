"""A task queue whose SQS queue does not exist is held as one (real Postgres, real SQS): one
failed SendMessageBatch holds it, its wake-ups wait for its probe instead of failing row by row,
and creating the SQS queue resumes delivery."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import psycopg
from relay_harness import Queues, Rows, metric_lines, task_ids_of

from taskplat.common.clock import FakeClock
from taskplat.common.db.queries import parse_queries
from taskplat.common.telemetry import Telemetry
from taskplat.outbox_relay.relay import Relay
from taskplat.outbox_relay.settings import RelaySettings

_SKIP_SQL = Path(__file__).with_name("relay_skip_rows.sql")
SKIP_Q = parse_queries(_SKIP_SQL.read_text(encoding="utf-8"), source=str(_SKIP_SQL))


def _requests(telemetry: Telemetry) -> int:
    """Every SQS call the relay made so far (GetQueueUrl and SendMessageBatch alike)."""
    prefix = "taskplat_sqs_requests_total{"
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in metric_lines(telemetry)
        if line.startswith(prefix)
    )


def _probes(telemetry: Telemetry, found: str) -> int:
    prefix = f'taskplat_queue_sqs_probes_total{{found="{found}",queue="ghost"}} '
    for line in metric_lines(telemetry):
        if line.startswith(prefix):
            return int(float(line.removeprefix(prefix)))
    return 0


def test_a_missing_queue_is_held_after_one_failure_probed_and_resumed_once_created(
    measured_relay: Relay,
    rows: Rows,
    queues: Queues,
    clock: FakeClock,
    settings: RelaySettings,
    telemetry: Telemetry,
) -> None:
    relay = measured_relay
    base = timedelta(seconds=settings.missing_queue_probe_base_seconds)
    present_url = queues.create("present")
    ghost = rows.queued_tasks("ghost", 25)
    present = rows.queued_tasks("present", 2)

    first = relay.run_once()
    assert (first.sent, first.failed, first.deferred) == (2, 25, 0)
    assert sorted(task_ids_of(queues.receive(present_url, 2))) == sorted(present)
    held = rows.queue("ghost")
    assert held is not None
    assert held["sqs_missing_since"] == clock.now()
    assert held["sqs_next_probe_at"] == clock.now() + base
    by_task = rows.by_task()
    assert {by_task[task_id]["available_at"] for task_id in ghost} == {clock.now() + base}
    assert {by_task[task_id]["send_attempts"] for task_id in ghost} == {1}
    flags = rows.held_flags()
    assert all(flags[by_task[task_id]["outbox_id"]] for task_id in ghost)
    assert 'taskplat_queue_sqs_holds_total{queue="ghost"} 1.0' in metric_lines(telemetry)
    calls = _requests(telemetry)
    # This batch's calls: for "present" its URL and one send; for ghost one failed URL look-up
    # per chunk of 10 rows (10, 10, 5), made at once.
    assert calls == 5

    # New wake-ups of the held queue are deferred to its probe, never sent.
    later = rows.queued_tasks("ghost", 5)
    batch = relay.run_once()
    assert (batch.claimed, batch.deferred, batch.sent, batch.failed) == (5, 5, 0, 0)
    assert relay.run_once().claimed == 0
    assert _requests(telemetry) == calls

    # The probe finds it still missing: the next one waits twice as long; no row is sent.
    clock.advance(base.total_seconds())
    batch = relay.run_once()
    assert (batch.deferred, batch.sent, batch.failed) == (30, 0, 0)
    assert _requests(telemetry) == calls + 1  # the probe's GetQueueUrl, nothing per row
    assert _probes(telemetry, "false") == 1
    held = rows.queue("ghost")
    assert held is not None
    assert held["sqs_probes"] == 1
    assert held["sqs_next_probe_at"] == clock.now() + 2 * base
    assert {row["send_attempts"] for row in rows.outbox() if row["queue"] == "ghost"} == {0, 1}

    # Created: the next probe resumes the queue and every wake-up goes out.
    ghost_url = queues.create("ghost")
    clock.advance(2 * base.total_seconds())
    batch = relay.run_once()
    assert (batch.sent, batch.failed, batch.deferred) == (30, 0, 0)
    assert _probes(telemetry, "true") == 1
    assert sorted(task_ids_of(queues.receive(ghost_url, 30))) == sorted(ghost + later)
    resumed = rows.queue("ghost")
    assert resumed is not None
    assert (resumed["sqs_missing_since"], resumed["sqs_next_probe_at"]) == (None, None)
    assert resumed["sqs_probes"] == 0


def test_the_probe_backoff_is_capped(
    relay: Relay, rows: Rows, clock: FakeClock, settings: RelaySettings
) -> None:
    rows.queued_tasks("ghost", 1)
    relay.run_once()
    waits = []
    for _ in range(6):
        held = rows.queue("ghost")
        assert held is not None
        clock.advance((held["sqs_next_probe_at"] - clock.now()).total_seconds())
        relay.run_once()
        held = rows.queue("ghost")
        assert held is not None
        waits.append((held["sqs_next_probe_at"] - clock.now()).total_seconds())
    base = settings.missing_queue_probe_base_seconds
    cap = settings.missing_queue_probe_max_seconds
    assert waits == [min(cap, base * 2**n) for n in range(1, 7)]


def test_a_missing_dead_letter_queue_holds_no_task_queue(relay: Relay, rows: Rows) -> None:
    task_id = rows.dead_task("default")
    assert relay.run_once().failed == 1
    assert rows.queue("default") is None
    assert rows.by_task()[task_id]["last_error"].endswith("does not exist")


def test_a_wakeup_of_a_held_queue_whose_task_left_queued_is_skipped_not_deferred(
    relay: Relay, rows: Rows, clock: FakeClock, settings: RelaySettings, db_url: str
) -> None:
    [task_id] = rows.queued_tasks("ghost", 1)
    relay.run_once()
    rows.raw_outbox("enqueue_task", task_id, "ghost", {"task_id": str(task_id)})
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SKIP_Q["cancel_tasks"], {"task_ids": [task_id]})
    clock.advance(settings.missing_queue_probe_base_seconds)
    batch = relay.run_once()
    assert (batch.skipped, batch.deferred) == (2, 0)


def test_a_queue_name_the_registry_cannot_hold_backs_off_row_by_row(
    relay: Relay, rows: Rows, clock: FakeClock, settings: RelaySettings
) -> None:
    # Written without the API (which refuses such a name): 65 characters, beyond the registry's.
    name = "q" * 65
    [task_id] = rows.queued_tasks(name, 1)
    assert relay.run_once().failed == 1
    assert rows.queue(name) is None
    row = rows.by_task()[task_id]
    assert row["send_attempts"] == 1 and row["last_error"]
    assert row["available_at"] <= clock.now() + timedelta(seconds=settings.retry_base_seconds)

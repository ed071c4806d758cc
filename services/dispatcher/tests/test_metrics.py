"""The dispatcher's /metrics after known workloads: counters with their labels, histogram counts
and sums (exact, from the fake clock), the Postgres-derived gauges, and what is never counted (a
rolled-back transition, an idempotent repeat)."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import psycopg
from dispatcher_metrics import Scrape, install_poison_triggers, scrape

from taskplat.testkit.dispatcher_calls import (
    cancel,
    claim,
    claimed,
    complete,
    create_task,
    heartbeat,
    output,
    replay,
)
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.testdb import with_database

CREATED = "taskplat_tasks_created_total"
CLAIMED = "taskplat_tasks_claimed_total"
COMPLETED = "taskplat_tasks_completed_total"
FAILED = "taskplat_tasks_failed_total"
DEAD = "taskplat_tasks_dead_total"
CANCELED = "taskplat_tasks_canceled_total"
REPLAYED = "taskplat_tasks_replayed_total"
LAG = "taskplat_task_schedule_lag_seconds"
TO_START = "taskplat_task_enqueue_to_start_seconds"
RUN_TIME = "taskplat_task_run_time_seconds"
HTTP = "taskplat_http_server_duration_seconds"


def _histogram(
    metrics: Scrape, name: str, *labels: str
) -> dict[tuple[str, ...], tuple[int, float]]:
    counts = metrics.series(f"{name}_count", *labels)
    sums = metrics.series(f"{name}_sum", *labels)
    return {key: (int(counts[key]), sums[key]) for key in counts}


def test_a_known_workload_shows_exact_counters_histograms_and_gauges(
    dispatcher: Dispatcher,
) -> None:
    clock = dispatcher.clock
    start = clock.now()
    alpha = [create_task(dispatcher, queue="alpha")["task_id"] for _ in range(3)]
    beta = create_task(dispatcher, queue="beta", operator="sleep")["task_id"]
    later = (start + timedelta(days=1)).isoformat()
    beta_later = create_task(dispatcher, queue="beta", operator="sleep", scheduled_for=later)
    clock.advance(2)
    first = claimed(dispatcher, alpha[0])  # schedule lag 2
    clock.advance(3)
    second = claimed(dispatcher, alpha[1])  # 5
    beta_lease = claimed(dispatcher, beta)  # 5
    assert heartbeat(dispatcher, beta_lease).status_code == 200
    clock.advance(10)
    assert complete(dispatcher, first).status_code == 200  # ran 13 s
    assert complete(dispatcher, beta_lease).status_code == 200  # 10 s
    failed = complete(dispatcher, second, "Failed", error_message="boom")  # 10 s
    assert failed.json()["task_status"] == "Failed"
    assert cancel(dispatcher, beta_later["task_id"]).status_code == 200
    stale = heartbeat(dispatcher, first)
    assert stale.status_code == 409 and stale.json()["reason"] == "NotRunning"
    assert claim(dispatcher, alpha[0]).json() == {"status": "NotClaimed", "reason": "Completed"}
    # Neither an idempotent repeat nor a repeated completion counts again.
    keyed = create_task(dispatcher, queue="beta", operator="sleep", idempotency_key="k-1")
    again = dispatcher.api.post(
        "/tasks", json={"operator": "sleep", "queue": "beta", "idempotency_key": "k-1"}
    )
    assert again.status_code == 200 and again.json()["task_id"] == keyed["task_id"]
    assert complete(dispatcher, first).json()["repeated"] is True
    assert dispatcher.anonymous.get("/no/such/path").status_code == 404
    assert dispatcher.api.delete("/tasks").status_code == 405

    metrics = scrape(dispatcher)

    assert metrics.series(CREATED, "queue", "operator") == {
        ("alpha", "echo"): 3,
        ("beta", "sleep"): 3,
    }
    assert metrics.series(CLAIMED, "queue", "operator") == {
        ("alpha", "echo"): 2,
        ("beta", "sleep"): 1,
    }
    assert metrics.series(COMPLETED, "queue", "operator") == {
        ("alpha", "echo"): 1,
        ("beta", "sleep"): 1,
    }
    assert metrics.series(FAILED, "queue", "operator", "reason") == {
        ("alpha", "echo", "Reported"): 1
    }
    assert metrics.series(CANCELED, "queue", "operator") == {("beta", "sleep"): 1}
    assert metrics.series(DEAD, "queue", "operator", "reason") == {}
    assert metrics.series("taskplat_claims_not_claimed_total", "reason") == {("Completed",): 1}
    assert metrics.series("taskplat_worker_calls_rejected_total", "route", "reason") == {
        ("/internal/heartbeat", "NotRunning"): 1
    }
    assert metrics.series("taskplat_heartbeats_total", "queue") == {("beta",): 1}

    assert _histogram(metrics, LAG, "queue") == {("alpha",): (2, 7.0), ("beta",): (1, 5.0)}
    assert _histogram(metrics, TO_START, "queue") == {("alpha",): (2, 7.0), ("beta",): (1, 5.0)}
    assert _histogram(metrics, RUN_TIME, "queue", "operator", "outcome") == {
        ("alpha", "echo", "Completed"): (1, 13.0),
        ("alpha", "echo", "Failed"): (1, 10.0),
        ("beta", "sleep", "Completed"): (1, 10.0),
    }
    assert metrics.value(f"{LAG}_bucket", queue="alpha", le="2.5") == 1
    assert metrics.value(f"{LAG}_bucket", queue="alpha", le="5") == 2

    requests = {
        key: count
        for key, (count, _) in _histogram(metrics, HTTP, "method", "route", "status").items()
    }
    assert requests[("POST", "/tasks", "201")] == 6
    assert requests[("POST", "/tasks", "200")] == 1
    assert requests[("POST", "/internal/task-claim", "200")] == 4
    assert requests[("POST", "/internal/heartbeat", "200")] == 1
    assert requests[("POST", "/internal/heartbeat", "409")] == 1
    assert requests[("POST", "/internal/task-complete", "200")] == 4
    assert requests[("PUT", "/tasks/{task_id}/cancel", "200")] == 1
    assert requests[("GET", "unmatched", "404")] == 1
    assert requests[("DELETE", "/tasks", "405")] == 1
    # Route labels are templates (or `unmatched`), never a raw path with a task id.
    assert dispatcher.app is not None
    templates = {getattr(route, "path", "") for route in dispatcher.app.routes} | {"unmatched"}
    assert {route for _, route, _ in requests} <= templates, requests

    # Gauges, 15 s after `start`: alpha[2] waits since `start`, the keyed beta task since now;
    # alpha[1] waits for its retry.
    assert metrics.series("taskplat_tasks_current", "queue", "status") == {
        ("alpha", "Queued"): 1,
        ("alpha", "Failed"): 1,
        ("beta", "Queued"): 1,
    }
    assert metrics.series("taskplat_queue_oldest_age_seconds", "queue") == {
        ("alpha",): 15.0,
        ("beta",): 0.0,
    }
    # Nothing relays in this test: every enqueue_task row is still pending.
    assert metrics.series("taskplat_outbox_pending", "kind") == {
        ("enqueue_task",): 5,
        ("dead_letter",): 0,
        ("route_event",): 0,
        ("invoke_lambda",): 0,
    }
    assert metrics.value("taskplat_outbox_oldest_age_seconds") == 15.0
    assert metrics.series("taskplat_tasks_dead_last_hour", "queue", "reason") == {}


def test_dead_tasks_replays_and_gauges_that_drop_to_zero(dispatcher: Dispatcher) -> None:
    clock = dispatcher.clock
    task_id = create_task(dispatcher, queue="gamma", operator="flaky", max_attempts=1)["task_id"]
    clock.advance(1)
    lease = claimed(dispatcher, task_id)
    clock.advance(4)
    died = complete(dispatcher, lease, "Failed", error_message="boom")
    assert died.json()["task_status"] == "Dead"

    metrics = scrape(dispatcher)
    assert metrics.series(FAILED, "queue", "operator", "reason") == {
        ("gamma", "flaky", "Reported"): 1
    }
    assert metrics.series(DEAD, "queue", "operator", "reason") == {
        ("gamma", "flaky", "AttemptsExhausted"): 1
    }
    assert metrics.series("taskplat_tasks_dead_last_hour", "queue", "reason") == {
        ("gamma", "AttemptsExhausted"): 1
    }
    assert metrics.series("taskplat_outbox_pending", "kind") == {
        ("enqueue_task",): 1,
        ("dead_letter",): 1,
        ("route_event",): 0,
        ("invoke_lambda",): 0,
    }
    assert metrics.series("taskplat_tasks_current", "queue", "status") == {}

    clock.advance(10)
    assert replay(dispatcher, task_id).status_code == 200
    clock.advance(2)
    metrics = scrape(dispatcher)
    assert metrics.series(REPLAYED, "queue", "operator") == {("gamma", "flaky"): 1}
    assert metrics.series("taskplat_tasks_current", "queue", "status") == {("gamma", "Queued"): 1}
    assert metrics.series("taskplat_queue_oldest_age_seconds", "queue") == {("gamma",): 2.0}

    clock.advance(3)
    replayed = claimed(dispatcher, task_id)
    assert replayed.attempt == 2
    assert complete(dispatcher, replayed).status_code == 200
    clock.advance(3600)
    metrics = scrape(dispatcher)
    # The replayed attempt's lag counts; enqueue-to-start counts a task's first claim only.
    assert _histogram(metrics, LAG, "queue") == {("gamma",): (2, 6.0)}
    assert _histogram(metrics, TO_START, "queue") == {("gamma",): (1, 1.0)}
    assert metrics.series(COMPLETED, "queue", "operator") == {("gamma", "flaky"): 1}
    # Series once reported stay, at 0: a drained queue reads 0 instead of vanishing.
    assert metrics.series("taskplat_tasks_current", "queue", "status") == {("gamma", "Queued"): 0}
    assert metrics.series("taskplat_queue_oldest_age_seconds", "queue") == {("gamma",): 0.0}
    assert metrics.series("taskplat_tasks_dead_last_hour", "queue", "reason") == {
        ("gamma", "AttemptsExhausted"): 0
    }


def test_a_rolled_back_transition_is_not_counted(db_url: str) -> None:
    install_poison_triggers(db_url)
    with serve_dispatcher(db_url) as dispatcher:
        refused = dispatcher.api.post("/tasks", json={"operator": "echo", "queue": "poison"})
        assert refused.status_code == 422, refused.text
        lease = claimed(dispatcher, create_task(dispatcher, queue="alpha")["task_id"])
        poisoned = complete(dispatcher, lease, outputs=[output(0, location="poison")])
        assert poisoned.status_code == 422, poisoned.text
        metrics = scrape(dispatcher)
        assert metrics.series(CREATED, "queue", "operator") == {("alpha", "echo"): 1}
        assert metrics.series(COMPLETED, "queue", "operator") == {}
        assert _histogram(metrics, RUN_TIME, "queue", "operator", "outcome") == {}
        assert metrics.series("taskplat_tasks_current", "queue", "status") == {
            ("alpha", "Running"): 1
        }
        # The same completion without the poison commits, and counts once.
        assert complete(dispatcher, lease).status_code == 200
        assert scrape(dispatcher).series(COMPLETED, "queue", "operator") == {("alpha", "echo"): 1}


def test_gauges_are_cached_for_metrics_cache_seconds(db_url: str) -> None:
    with serve_dispatcher(db_url, metrics_cache_seconds=3600) as dispatcher:
        create_task(dispatcher, queue="alpha")
        assert (
            scrape(dispatcher).value("taskplat_tasks_current", queue="alpha", status="Queued") == 1
        )
        create_task(dispatcher, queue="alpha")
        metrics = scrape(dispatcher)
        # Counters are live; the Postgres gauges are the cached reading.
        assert metrics.value(CREATED, queue="alpha", operator="echo") == 2
        assert metrics.value("taskplat_tasks_current", queue="alpha", status="Queued") == 1


def test_metrics_answer_without_the_gauges_when_postgres_is_unreachable(db_url: str) -> None:
    missing = with_database(db_url, f"tp_missing_{uuid4().hex}")
    with serve_dispatcher(missing, db_connect_timeout_seconds=0.5, db_pool_min_size=1) as broken:
        assert broken.anonymous.get("/healthz").status_code == 200
        metrics = scrape(broken)
        assert metrics.series("taskplat_tasks_current", "queue", "status") == {}
        assert metrics.value("taskplat_outbox_oldest_age_seconds") is None
        # The process's own metrics are still there.
        assert metrics.value(f"{HTTP}_count", method="GET", route="/healthz", status="200") == 1


def test_a_held_wake_up_is_late_only_from_when_it_came_due_again(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """The relay holds back wake-ups deep in a backlog that is claimed ahead (migration 0013):
    waiting to be looked at again is not lateness, and the relay scales on this gauge."""
    clock = dispatcher.clock
    create_task(dispatcher, queue="gamma")
    clock.advance(15)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox SET held = true, available_at = %s WHERE sent_at IS NULL",
            (clock.now() + timedelta(seconds=5),),
        )
    metrics = scrape(dispatcher)
    assert metrics.series("taskplat_outbox_pending", "kind")[("enqueue_task",)] == 1
    assert metrics.value("taskplat_outbox_oldest_age_seconds") == 0.0
    clock.advance(7)  # due for 2 s, the relay has not come to it yet
    assert scrape(dispatcher).value("taskplat_outbox_oldest_age_seconds") == 2.0

"""The queue registry (`GET /queues`, pause and resume, unknown queues refused), bulk replay
(`POST /tasks/retry`) and the dashboard's figures (`GET /stats`)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from dispatcher_metrics import scrape

from taskplat.testkit.dispatcher_calls import cancel, claim, claimed, complete, create_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import outbox_rows, task_row
from taskplat.testkit.loops_rows import LoopRows


def _dead(dispatcher: Dispatcher, **fields: Any) -> str:
    task = create_task(dispatcher, max_attempts=1, **fields)
    lease = claimed(dispatcher, task["task_id"])
    response = complete(dispatcher, lease, "Failed", error_message="boom")
    assert response.status_code == 200, response.text
    return str(task["task_id"])


def _queues(dispatcher: Dispatcher) -> dict[str, dict[str, Any]]:
    response = dispatcher.api.get("/queues")
    assert response.status_code == 200, response.text
    return {queue["name"]: queue for queue in response.json()["queues"]}


def test_unknown_queues_are_refused_naming_the_known_ones(dispatcher: Dispatcher) -> None:
    response = dispatcher.api.post("/tasks", json={"operator": "echo", "queue": "nowhere"})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "validation_error"
    assert "'nowhere'" in body["message"] and "default" in body["message"]
    assert body["detail"][0]["loc"] == ["body", "queue"]
    batch = dispatcher.api.post(
        "/tasks/batch", json={"tasks": [{"operator": "echo"}, {"operator": "e", "queue": "zz"}]}
    )
    assert batch.status_code == 422 and "'zz'" in batch.json()["message"]
    assert dispatcher.api.get("/tasks").json()["tasks"] == []  # nothing half-written


def test_get_queues_shows_depth_oldest_age_and_paused(dispatcher: Dispatcher) -> None:
    first = create_task(dispatcher, queue="alpha")
    dispatcher.clock.advance(30)
    create_task(dispatcher, queue="alpha")
    claimed(dispatcher, create_task(dispatcher, queue="beta")["task_id"])
    queues = _queues(dispatcher)
    assert set(queues) >= {"default", "alpha", "beta"}
    alpha, beta = queues["alpha"], queues["beta"]
    assert alpha["depth"] == 2 and alpha["running"] == 0 and not alpha["paused"]
    assert alpha["oldest_queued_at"] == first["created_at"]
    assert alpha["oldest_queued_age_seconds"] == 30.0
    assert beta["depth"] == 0 and beta["running"] == 1 and beta["oldest_queued_age_seconds"] is None


def test_a_paused_queue_hands_out_nothing_until_it_resumes(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task = create_task(dispatcher, queue="alpha")
    other = create_task(dispatcher, queue="beta")
    paused = dispatcher.api.put("/queues/alpha/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["paused_at"] is not None
    assert dispatcher.api.put("/queues/alpha/pause").json()["paused"] is True  # idempotent

    answer = claim(dispatcher, task["task_id"]).json()
    assert answer == {"status": "NotClaimed", "reason": "Paused"}
    batch = dispatcher.worker.post(
        "/internal/task-claim-batch",
        json={"worker_id": "w", "task_ids": [task["task_id"], other["task_id"]]},
    ).json()
    assert [item["reason"] for item in batch["not_claimed"]] == ["Paused"]
    assert [item["task"]["task_id"] for item in batch["claimed"]] == [other["task_id"]]
    nothing = dispatcher.worker.post(
        "/internal/task-claim-next", json={"worker_id": "w", "queue": "alpha", "max": 5}
    ).json()
    assert nothing == {"claimed": []}
    assert _queues(dispatcher)["alpha"]["depth"] == 1

    wakeups_before = len(outbox_rows(db_url, task["task_id"]))
    resumed = dispatcher.api.put("/queues/alpha/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    # The wake-up answered Paused was consumed: the resume announces the task again.
    assert len(outbox_rows(db_url, task["task_id"])) == wakeups_before + 1
    assert dispatcher.api.put("/queues/alpha/resume").status_code == 200
    assert len(outbox_rows(db_url, task["task_id"])) == wakeups_before + 1
    claimed(dispatcher, task["task_id"])

    metrics = scrape(dispatcher)
    assert metrics.series("taskplat_queue_pauses_total", "queue", "action") == {
        ("alpha", "pause"): 1,
        ("alpha", "resume"): 1,
    }


def test_a_queue_held_for_its_missing_sqs_queue_shows_it_and_stays_claimable(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task = create_task(dispatcher, queue="alpha")
    queues = _queues(dispatcher)
    assert queues["alpha"]["sqs"] == {
        "state": "ok",
        "since": None,
        "next_probe_at": None,
        "probes": 0,
    }
    assert scrape(dispatcher).value("taskplat_queues_sqs_missing") == 0

    rows = LoopRows(db_url)
    try:
        rows.set_queue_sqs_missing("alpha", True)
    finally:
        rows.close()
    held = _queues(dispatcher)["alpha"]["sqs"]
    assert held["state"] == "missing" and held["probes"] == 0
    assert held["since"] is not None and held["next_probe_at"] is not None
    one = dispatcher.api.get("/queues/alpha")
    assert one.status_code == 200, one.text
    assert one.json() == _queues(dispatcher)["alpha"]
    assert _queues(dispatcher)["default"]["sqs"]["state"] == "ok"
    assert scrape(dispatcher).value("taskplat_queues_sqs_missing") == 1

    # Its tasks stay Queued and claimable without a wake-up.
    taken = dispatcher.worker.post(
        "/internal/task-claim-next", json={"worker_id": "w", "queue": "alpha", "max": 5}
    ).json()
    assert [item["task"]["task_id"] for item in taken["claimed"]] == [task["task_id"]]


def test_get_queue_of_unknown_or_invalid_queue(dispatcher: Dispatcher) -> None:
    missing = dispatcher.api.get("/queues/ghost")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    bad = dispatcher.api.get("/queues/bad%20name")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["path", "queue"]
    assert dispatcher.anonymous.get("/queues/default").status_code == 401


def test_pause_of_unknown_or_invalid_queue(dispatcher: Dispatcher) -> None:
    missing = dispatcher.api.put("/queues/ghost/pause")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert dispatcher.api.put("/queues/ghost/resume").status_code == 404
    bad = dispatcher.api.put("/queues/bad%20name/pause")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["path", "queue"]
    assert dispatcher.anonymous.put("/queues/alpha/pause").status_code == 401
    assert dispatcher.anonymous.get("/queues").status_code == 401


def test_bulk_replay_by_ids(dispatcher: Dispatcher, db_url: str) -> None:
    dead = [_dead(dispatcher) for _ in range(2)]
    queued = create_task(dispatcher)["task_id"]
    unknown = str(uuid4())
    response = dispatcher.api.post("/tasks/retry", json={"ids": [*dead, queued, unknown]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert sorted(body["replayed"]) == sorted(dead)
    assert body["skipped"] == [
        {"task_id": queued, "reason": "NotReplayable"},
        {"task_id": unknown, "reason": "NotFound"},
    ]
    for task_id in dead:
        task = dispatcher.api.get(f"/tasks/{task_id}").json()
        assert task["status"] == "Queued" and task["attempt"] == 2
        assert [row["kind"] for row in outbox_rows(db_url, task_id)].count("enqueue_task") == 2
    assert scrape(dispatcher).series("taskplat_bulk_replays_total", "by") == {("ids",): 1}


def test_bulk_replay_by_filter(dispatcher: Dispatcher) -> None:
    job = {"dag_name": "monad", "name": "follow"}
    alpha = [_dead(dispatcher, queue="alpha") for _ in range(3)]
    beta = _dead(dispatcher, queue="beta", operator="sleep")
    jobbed = _dead(dispatcher, queue="beta", job=job)
    canceled = create_task(dispatcher, queue="alpha")["task_id"]
    assert cancel(dispatcher, canceled).status_code == 200

    def retry(body: dict[str, Any]) -> list[str]:
        response = dispatcher.api.post("/tasks/retry", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["skipped"] == []
        return sorted(response.json()["replayed"])

    assert len(retry({"queue": "alpha", "limit": 2})) == 2  # Dead by default, at most limit
    assert len(retry({"queue": "alpha"})) == 1
    assert retry({"queue": "alpha"}) == []
    assert retry({"dag": "monad", "job": "follow"}) == [jobbed]
    assert retry({"operator": "sleep"}) == [beta]
    assert retry({"status": "Canceled"}) == [canceled]
    statuses = {dispatcher.api.get(f"/tasks/{t}").json()["status"] for t in alpha}
    assert statuses == {"Queued"}


def test_bulk_replay_bad_input(dispatcher: Dispatcher) -> None:
    cases = [
        {"ids": [str(uuid4())], "queue": "alpha"},
        {"ids": []},
        {"ids": ["not-a-uuid"]},
        {"status": "Completed"},
        {"limit": 0},
        {"limit": 1001},
        {"queue": "bad queue"},
        {"surprise": 1},
    ]
    for body in cases:
        response = dispatcher.api.post("/tasks/retry", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"] == "validation_error"


def test_stats_counts_and_throughput(dispatcher: Dispatcher) -> None:
    create_task(dispatcher, queue="alpha")
    create_task(dispatcher, queue="alpha")
    done = claimed(dispatcher, create_task(dispatcher, queue="beta")["task_id"])
    assert complete(dispatcher, done).status_code == 200
    _dead(dispatcher, queue="beta")
    response = dispatcher.api.get("/stats")
    assert response.status_code == 200, response.text
    body = response.json()
    counts = {(row["queue"], row["status"]): row["tasks"] for row in body["counts"]}
    assert counts == {("alpha", "Queued"): 2, ("beta", "Completed"): 1, ("beta", "Dead"): 1}
    assert [(b["completed"], b["dead"]) for b in body["throughput"]] == [(1, 1)]
    # An hour later the finished tasks leave the figures.
    dispatcher.clock.advance(7200)
    later = dispatcher.api.get("/stats").json()
    assert later["throughput"] == [] and len(later["counts"]) == 1


def test_single_and_bulk_replay_leave_the_same_task(dispatcher: Dispatcher, db_url: str) -> None:
    """Both replays are one function (taskplat_replay): a canceled task and a dead one replayed
    alone and in bulk end with the same row (no reason of the replayed attempt left) and one
    wake-up each. The bulk copy once kept `cancel_reason`."""
    compared = (
        "status", "attempt", "replay_offset", "processing_attempts", "lease_token",
        "lease_expires_at", "deadline_at", "worker_id", "started_at", "finished_at",
        "next_retry_at", "expires_at", "attempt_outcome", "dead_reason", "cancel_reason", "result",
    )  # fmt: skip

    def canceled(dispatcher: Dispatcher) -> str:
        task_id = str(create_task(dispatcher)["task_id"])
        assert cancel(dispatcher, task_id).status_code == 200
        return task_id

    for make, reason in ((canceled, "cancel_reason"), (_dead, "dead_reason")):
        alone, together = make(dispatcher), make(dispatcher)
        assert task_row(db_url, together)[reason] is not None
        assert dispatcher.api.post(f"/tasks/{alone}/retry").status_code == 200
        bulk = dispatcher.api.post("/tasks/retry", json={"ids": [together]})
        assert bulk.status_code == 200 and bulk.json()["replayed"] == [together], bulk.text
        single_row, bulk_row = (task_row(db_url, task_id) for task_id in (alone, together))
        assert single_row is not None and bulk_row is not None
        assert {k: single_row[k] for k in compared} == {k: bulk_row[k] for k in compared}
        assert single_row["status"] == "Queued" and single_row[reason] is None
        for task_id in (alone, together):
            wakeups = [r for r in outbox_rows(db_url, task_id) if r["kind"] == "enqueue_task"]
            assert len(wakeups) == 2  # the create's and the replay's

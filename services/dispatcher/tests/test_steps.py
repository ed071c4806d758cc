"""Step results (`POST /internal/steps`) against a real Postgres: the first recorded result wins, a
later attempt gets it back, a stale attempt or lease is refused, the attempt token serves its own
attempt's steps, results are size-capped and bad bodies answer 422."""

from __future__ import annotations

from typing import Any

import httpx

from taskplat.testkit.dispatcher_calls import Lease, assert_rejected, claimed, create_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import promote_retry, reap_timeout


def _step(d: Dispatcher, lease: Lease, step: str, **fields: Any) -> httpx.Response:
    return d.worker.post("/internal/steps", json={**lease.fence(), "step": step, **fields})


def test_the_first_result_wins_and_a_retry_gets_it_back(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    task_id = create_task(d, max_attempts=3)["task_id"]
    first = claimed(d, task_id)
    assert _step(d, first, "charge").json() == {
        "status": "NotFound", "result": None, "attempt": None
    }  # fmt: skip
    recorded = _step(d, first, "charge", result={"charge_id": "ch_1"})
    assert recorded.json() == {"status": "Recorded", "result": {"charge_id": "ch_1"}, "attempt": 1}
    again = _step(d, first, "charge", result={"charge_id": "ch_2"}).json()
    assert again == {"status": "Existing", "result": {"charge_id": "ch_1"}, "attempt": 1}
    # A null result is a result.
    assert _step(d, first, "notify", result=None).json()["status"] == "Recorded"

    now = d.clock.advance(d.settings.lease_ttl_seconds + 1)
    assert reap_timeout(db_url, task_id, 1, first.lease_token, now) == "Failed"
    assert promote_retry(db_url, task_id, 1, now) == 2
    second = claimed(d, task_id)
    assert second.attempt == 2
    looked_up = _step(d, second, "charge").json()
    assert looked_up == {"status": "Existing", "result": {"charge_id": "ch_1"}, "attempt": 1}
    assert _step(d, second, "notify").json()["status"] == "Existing"
    # The first attempt is stale now: refused, nothing stored.
    assert_rejected(_step(d, first, "other", result=1), "StaleAttempt")
    assert _step(d, second, "other").json()["status"] == "NotFound"
    stale_lease = Lease(task_id, 2, first.lease_token)
    assert_rejected(_step(d, stale_lease, "other", result=1), "StaleLease")


def test_the_attempt_token_records_steps_and_results_are_capped(
    dispatcher: Dispatcher,
) -> None:
    d = dispatcher
    task_id = create_task(d)["task_id"]
    response = d.worker.post("/internal/task-claim", json={"task_id": task_id, "worker_id": "w"})
    body = response.json()
    lease = Lease(task_id, body["attempt"], body["lease_token"])
    headers = {"Authorization": f"Bearer {body['attempt_token']}"}
    with httpx.Client(base_url=d.base_url, headers=headers) as client:
        call = {**lease.fence(), "step": "s", "result": [1, 2]}
        answer = client.post("/internal/steps", json=call)
        assert answer.status_code == 200 and answer.json()["status"] == "Recorded", answer.text
    big = "x" * (d.settings.result_max_bytes + 1)
    too_large = _step(d, lease, "big", result=big)
    assert too_large.status_code == 422 and "cap" in too_large.json()["message"]
    for bad in ({"result": 1}, {"step": "", "result": 1}, {"step": "a\u0000", "result": 1},
                {"step": "s", "result": "\u0000"}, {"step": "s", "extra": 1}):  # fmt: skip
        refused = d.worker.post("/internal/steps", json={**lease.fence(), **bad})
        assert refused.status_code == 422, (bad, refused.text)
    unknown = Lease("00000000-0000-4000-8000-000000000000", 1, lease.lease_token)
    assert _step(d, unknown, "s").status_code == 404

"""A wake-up whose claim a limit of its queue held back is kept, not deleted: the wrapper hides
its SQS message for the answer's `retry_after_ms`, and the task runs once a slot is free; the
queue's limit holds across the wrapper's slots, measured from the attempts' own times."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from test_wrapper import running_wrapper
from wrapper_harness import Dispatcher, Queue

from taskplat.devstack.flow_checks import max_running
from taskplat.devstack.waiting import wait_for


def test_a_limited_wake_up_comes_back_and_the_limit_holds_across_slots(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    response = dispatcher.api.put("/queues/default", json={"concurrency_limit": 1})
    assert response.status_code == 200, response.text
    record = tmp_path / "runs.txt"
    tasks = [
        dispatcher.create("record", config={"path": str(record), "seconds": 1})["task_id"]
        for _ in range(3)
    ]
    for task_id in tasks:
        queue.wake(task_id)
    with running_wrapper(dispatcher, queue, operators_file, concurrency=3, claim_ahead=False):
        done = [dispatcher.wait_status(task_id, "Completed", timeout=60) for task_id in tasks]
        queue.wait_empty()
    spans = []
    for task in done:
        [attempt] = task["attempts"]  # one attempt each: no claim over the limit spent one
        spans.append((datetime.fromisoformat(attempt["started_at"]).timestamp(),
                      datetime.fromisoformat(attempt["finished_at"]).timestamp()))  # fmt: skip
    assert max_running(spans) == 1
    assert sorted(line.split()[0] for line in record.read_text().splitlines()) == sorted(tasks)
    metrics = wait_for(
        lambda: dispatcher.api.get("/metrics").text, timeout=5, what="the dispatcher's metrics"
    )
    assert 'taskplat_claims_limited_total{queue="default",reason="ConcurrencyLimited"}' in metrics

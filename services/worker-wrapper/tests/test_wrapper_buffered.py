"""Step results and published records through a real wrapper, dispatcher process and SQS: a step
recorded by a failed first attempt is not run again by the retry, and records an operator publishes
(batched into 256 KiB messages) reach the dataset's buffer before the task completes, and the sink
writes them once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool
from wrapper_harness import Dispatcher, InProcessWrapper, Queue, wrapper_settings

from taskplat.common.db.pools import make_pool
from taskplat.common.sqs import sqs_client
from taskplat.devstack.waiting import wait_for
from taskplat.sink.sink import Sink
from taskplat.testkit.dispatcher_rows import promote_retry
from taskplat.testkit.sink_harness import ORG, make_settings, table_rows


@contextmanager
def running_wrapper(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> Iterator[InProcessWrapper]:
    wrapper = InProcessWrapper(wrapper_settings(dispatcher, queue, operators_file))
    wrapper.start()
    try:
        yield wrapper
    finally:
        wrapper.stop()


def test_a_retry_gets_the_step_result_without_running_the_step(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path, db_url: str
) -> None:
    ran = tmp_path / "charges.txt"
    task = dispatcher.create(
        "steps", config={"path": str(ran)}, max_attempts=2, backoff_base_seconds=0,
        backoff_max_seconds=0,
    )  # fmt: skip
    with running_wrapper(dispatcher, queue, operators_file):
        queue.wake(task["task_id"])
        dispatcher.wait_status(task["task_id"], "Failed")
        # The scheduler's retry and the relay's wake-up (neither runs in these tests).
        assert promote_retry(db_url, task["task_id"], 1, datetime.now(UTC)) == 2
        queue.wake(task["task_id"])
        done = dispatcher.wait_status(task["task_id"], "Completed")
    assert done["result"] == {"charge": {"charged_by": 1}}
    assert ran.read_text().splitlines() == [f"{task['task_id']} 1"]


def _dag(name: str) -> dict[str, Any]:
    return {
        "jobs": {
            "produce": {
                "operator": "publish",
                "outputs": [{"index": 0, "dataset": name, "kind": "buffered_postgres",
                             "schema": [{"name": "note", "type": "text"}]}],
            }
        }
    }  # fmt: skip


def test_published_records_reach_the_buffer_before_completion(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, db_url: str,
    sqs_endpoint_url: str,
) -> None:  # fmt: skip
    assert dispatcher.api.put("/dags/pub", json=_dag("notes")).status_code == 201
    settings = make_settings(db_url, sqs_endpoint_url)
    pool: ConnectionPool[Connection[DictRow]] = make_pool(settings, application_name="t")
    pool.open(wait=True, timeout=10)
    sink = Sink(settings, pool=pool, sqs=sqs_client(settings))
    try:
        (buffer,) = sink.discover()
        # 600 records of ~1 KiB: three SQS messages at most 256 KiB each.
        config = {"org_id": ORG, "prefix": "n", "count": 600, "pad": 1000}
        runs = [dispatcher.api.post("/dags/pub/jobs/produce/runs", json={"config": config})
                for _ in range(2)]  # fmt: skip
        with running_wrapper(dispatcher, queue, operators_file):
            for run in runs:
                queue.wake(run.json()["task_id"])
            for run in runs:
                done = dispatcher.wait_status(run.json()["task_id"], "Completed")
                assert done["result"] == {"published": 600}
        depth = (
            sink.discover()
            and sink._sqs.get_queue_attributes(
                QueueUrl=buffer.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]["ApproximateNumberOfMessages"]
        )
        assert 2 * 3 <= int(depth) <= 2 * 4
        table = f"dataset_{buffer.dataset_uuid}"
        wait_for(
            lambda: sink.run_once() and len(table_rows(db_url, table)) == 600, timeout=30,
            what="600 distinct rows",
        )  # fmt: skip
    finally:
        sink.close()
        pool.close()

"""The sink against a real Postgres and a real SQS: queues created on discovery (with a redrive
policy), duplicates within and across messages and across two replicas written once, one event per
write with a growing cursor and its route_event row, every bad input dead-lettered with its reason
while the rest of the batch is written, a sink that died between its commit and its deletes writes
nothing twice, and the buffer depth gauge."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from taskplat.common.telemetry import Telemetry
from taskplat.devstack.waiting import wait_for
from taskplat.sink.sink import Buffer, Message, Sink
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.sink_harness import (
    ORG,
    body,
    buffered_dag,
    dataset_events,
    dead_letters,
    publish,
    record,
    table_rows,
)

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

SinkFactory = Callable[..., Sink]


def _table(dataset: dict[str, Any]) -> str:
    return str(dataset["location"]).removeprefix("postgres_table:")


def _buffer(make_sink: SinkFactory) -> Buffer:
    (buffer,) = make_sink().discover()
    return buffer


def _drain(sink: Sink, sqs: SQSClient, queue_url: str) -> None:
    def empty() -> bool:
        sink.run_once()
        attributes = sqs.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return all(int(value) == 0 for value in attributes.values())

    wait_for(empty, timeout=30, interval=0.05, what="the buffer drained")


def test_a_new_dataset_gets_its_queues_and_the_view_its_url(
    dispatcher: Dispatcher, make_sink: SinkFactory, sqs: SQSClient
) -> None:
    dispatcher.api.put("/dags/alerts", json=buffered_dag())
    (listed,) = dispatcher.api.get("/datasets").json()["datasets"]
    before = dispatcher.api.get(f"/datasets/{listed['dataset_uuid']}").json()
    assert before["buffer_queue_url"] is None
    sink = make_sink()
    (buffer,) = sink.discover()
    assert buffer.queue_url.endswith(f"buffer-{listed['dataset_uuid'].replace('-', '')}")
    after = dispatcher.api.get(f"/datasets/{listed['dataset_uuid']}").json()
    assert after["buffer_queue_url"] == buffer.queue_url
    redrive = sqs.get_queue_attributes(QueueUrl=buffer.queue_url, AttributeNames=["All"])[
        "Attributes"
    ]["RedrivePolicy"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=buffer.dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    assert json.loads(redrive)["deadLetterTargetArn"] == dlq_arn
    # Discovering again changes nothing; a second replica finds the same queues.
    assert make_sink().discover() == [buffer]


def test_duplicates_across_messages_and_replicas_are_written_once(
    dataset: dict[str, Any], make_sink: SinkFactory, sqs: SQSClient, db_url: str
) -> None:
    queue_url = dataset["buffer_queue_url"]
    # 40 messages of 10 records over 200 distinct keys: every key is sent twice, some within one
    # message, most in two different messages.
    bodies = [
        body(dataset, [record(f"k{(m * 5 + r) % 200}", score=m) for r in range(10)])
        for m in range(40)
    ]
    publish(sqs, queue_url, bodies)
    replicas = [make_sink(), make_sink()]
    for sink in replicas:
        sink.discover()
    stop = threading.Event()
    threads = [threading.Thread(target=_spin, args=(sink, stop)) for sink in replicas]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: len(table_rows(db_url, _table(dataset))) == 200
            and _settled(sqs, queue_url),
            timeout=60, interval=0.2, what="200 distinct rows",
        )  # fmt: skip
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    rows = table_rows(db_url, _table(dataset))
    assert sorted(row["dedupe_key"] for row in rows) == sorted(f"k{i}" for i in range(200))
    events = dataset_events(db_url, dataset["dataset_uuid"])
    cursors = [event["cursor"] for event in events]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    assert cursors[-1] == max(row["row_id"] for row in rows)
    assert all(event["route_rows"] == 1 for event in events)
    assert {str(event["dataset_version"]) for event in events} == {dataset["current_version"]}


def _spin(sink: Sink, stop: threading.Event) -> None:
    while not stop.is_set():
        sink.run_once()


def _settled(sqs: SQSClient, queue_url: str) -> bool:
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return all(int(value) == 0 for value in attributes.values())


def test_every_bad_input_is_dead_lettered_with_its_reason(
    dataset: dict[str, Any], make_sink: SinkFactory, sqs: SQSClient, db_url: str
) -> None:
    buffer = _buffer(make_sink)
    other = "00000000-0000-4000-8000-0000000000ff"
    bad = {
        "MalformedMessage": ["not json", "[1, 2]", json.dumps({"records": []}),
                             body(dataset, []), body(dataset, [record("x")], extra=1),
                             body(dataset, [record("x")], dataset_uuid="nope")],
        "UnknownDataset": [body(dataset, [record("x")], dataset_uuid=other)],
        "SchemaMismatch": [body(dataset, [record("x")], schema_hash="sha256:00")],
        "MalformedRecord": [body(dataset, [record("x"), {"org_id": ORG}]),
                            body(dataset, [record("x", nope=1)]),
                            body(dataset, [record("x", score="high")]),
                            body(dataset, [{"org_id": "not-a-uuid", "dedupe_key": "x"}]),
                            body(dataset, [record("x", severity="a\u0000b")]),
                            body(dataset, ["not an object"])],
    }  # fmt: skip
    good = [body(dataset, [record("good-1")]), body(dataset, [record("good-2", payload={"a": 1})])]
    publish(sqs, buffer.queue_url, [*good[:1], *[b for bs in bad.values() for b in bs], good[1]])
    sink = make_sink()
    sink.discover()
    _drain(sink, sqs, buffer.queue_url)
    rows = table_rows(db_url, _table(dataset))
    assert [row["dedupe_key"] for row in rows] == ["good-1", "good-2"]
    assert rows[1]["payload"] == {"a": 1}
    expected = sum(len(bodies) for bodies in bad.values())
    found = dead_letters(sqs, buffer.dlq_url, expected)
    assert sorted(found) == sorted((reason, b) for reason, bs in bad.items() for b in bs)
    # The sink keeps serving.
    publish(sqs, buffer.queue_url, [body(dataset, [record("after")])])
    _drain(sink, sqs, buffer.queue_url)
    assert len(table_rows(db_url, _table(dataset))) == 3


class _DiesBeforeDeleting(Sink):
    """A sink killed between its commit and its deletes: the messages stay in the buffer."""

    def _delete(self, buffer: Buffer, messages: list[Message]) -> None:
        self.left = [m.receipt_handle for m in messages]


def test_a_sink_that_died_before_deleting_writes_nothing_twice(
    dataset: dict[str, Any], make_sink: SinkFactory, sqs: SQSClient, db_url: str, settings: Any,
    pool: Any,
) -> None:  # fmt: skip
    buffer = _buffer(make_sink)
    publish(sqs, buffer.queue_url, [body(dataset, [record(f"r{i}") for i in range(5)])])
    dying = _DiesBeforeDeleting(settings, pool=pool, sqs=sqs)
    try:
        dying.discover()
        wait_for(lambda: dying.run_once().written == 5, timeout=20, what="the first write")
    finally:
        dying.close()
    for handle in dying.left:  # its visibility timeout ends now
        sqs.change_message_visibility(
            QueueUrl=buffer.queue_url, ReceiptHandle=handle, VisibilityTimeout=0
        )
    events_before = dataset_events(db_url, dataset["dataset_uuid"])
    sink = make_sink()
    sink.discover()
    _drain(sink, sqs, buffer.queue_url)
    assert len(table_rows(db_url, _table(dataset))) == 5
    assert dataset_events(db_url, dataset["dataset_uuid"]) == events_before


def test_the_buffer_depth_gauge(
    dataset: dict[str, Any], make_sink: SinkFactory, sqs: SQSClient
) -> None:
    telemetry = Telemetry("sink")
    try:
        sink = make_sink(telemetry)
        publish(
            sqs, dataset["buffer_queue_url"], [body(dataset, [record(f"g{i}")]) for i in range(3)]
        )

        def gauge() -> bool:
            sink.discover()
            text = telemetry.prometheus_text().decode()
            return "taskplat_sink_buffer_messages 3.0" in text

        wait_for(gauge, timeout=20, interval=0.2, what="the gauge at 3")
        _drain(sink, sqs, dataset["buffer_queue_url"])
        text = telemetry.prometheus_text().decode()
        assert "taskplat_sink_records_written_total 3.0" in text
        assert "taskplat_sink_buffer_age_seconds_count" in text
    finally:
        telemetry.shutdown()


def test_an_idle_buffer_does_not_pace_a_busy_one(
    dispatcher: Dispatcher,
    settings: Any,
    pool: Any,
    sqs: SQSClient,
    db_url: str,
) -> None:
    """A round waits for every buffer; once a round found messages, the next one does not long-poll
    (so the idle dataset's empty long poll does not hold the busy one's next batch)."""
    quiet = {
        "jobs": {
            "produce": {
                "operator": "echo",
                "outputs": [{"index": 0, "dataset": "quiet", "kind": "buffered_postgres",
                             "schema": [{"name": "severity", "type": "text"}]}],
            },
        }
    }  # fmt: skip
    assert dispatcher.api.put("/dags/quiet", json=quiet).status_code == 201
    assert dispatcher.api.put("/dags/alerts", json=buffered_dag()).status_code == 201
    long_poll = 5
    sink = Sink(
        settings.model_copy(update={"wait_time_seconds": long_poll, "messages_per_write": 10}),
        pool=pool,
        sqs=sqs,
    )
    try:
        buffers = sink.discover()
        assert len(buffers) == 2
        alerts = next(
            view
            for view in dispatcher.api.get("/datasets").json()["datasets"]
            if view["name"] == "alerts"
        )
        alerts = dispatcher.api.get(f"/datasets/{alerts['dataset_uuid']}").json()
        bodies = [body(alerts, [record(f"k{m}")]) for m in range(30)]
        publish(sqs, alerts["buffer_queue_url"], bodies)
        first = sink.run_once()  # the quiet buffer's long poll paces this one
        assert first.messages == 10
        started = time.monotonic()
        rounds = [sink.run_once(), sink.run_once()]
        took = time.monotonic() - started
        assert [each.messages for each in rounds] == [10, 10]
        assert took < long_poll, f"two rounds with work took {took:.1f}s: they long-polled"
        assert len(table_rows(db_url, _table(alerts))) == 30
        assert sink.run_once().messages == 0  # nothing left: the next round long-polls again
    finally:
        sink.close()

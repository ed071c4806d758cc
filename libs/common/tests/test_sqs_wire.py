"""The wire SQS client against a real SQS API: the same answers and errors as boto3's, retries of
transport failures only, one request count per call."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from taskplat.chaos.injector import FaultRates, SqsFaultInjector
from taskplat.common.settings import SqsSettings
from taskplat.common.sqs import sqs_client
from taskplat.common.sqs_wire import WireSqs

TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


def settings(endpoint: str, **overrides: Any) -> SqsSettings:
    return SqsSettings(sqs_endpoint_url=endpoint, **overrides)


@pytest.fixture
def clients(sqs_endpoint_url: str) -> tuple[Any, Any, str]:
    """A wire client, a plain boto3 client, and a fresh queue's URL."""
    wire = sqs_client(settings(sqs_endpoint_url))
    plain = sqs_client(settings(sqs_endpoint_url, sqs_wire_client=False))
    assert isinstance(wire, WireSqs)
    assert not isinstance(plain, WireSqs)
    url = plain.create_queue(QueueName=f"wire-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    return wire, plain, url


def _without_metadata(answer: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in answer.items() if key != "ResponseMetadata"}


def _receive(client: Any, url: str, most: int = 1) -> dict[str, Any]:
    answer: dict[str, Any] = client.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=most,
        WaitTimeSeconds=1,
        VisibilityTimeout=30,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
        MessageAttributeNames=["All"],
    )
    return answer


def test_hot_calls_answer_as_boto3_does(clients: tuple[Any, Any, str]) -> None:
    wire, plain, url = clients
    entries = [
        {
            "Id": "0",
            "MessageBody": json.dumps({"task_id": "t"}),
            "MessageAttributes": {
                "traceparent": {"DataType": "String", "StringValue": TRACEPARENT}
            },
        }
    ]
    sent = [wire.send_message_batch(QueueUrl=url, Entries=entries)]
    sent.append(plain.send_message_batch(QueueUrl=url, Entries=entries))
    assert [sorted(_without_metadata(answer)) for answer in sent] == [["Successful"]] * 2
    assert sorted(sent[0]["Successful"][0]) == sorted(sent[1]["Successful"][0])

    by_wire, by_plain = _receive(wire, url)["Messages"], _receive(plain, url)["Messages"]
    messages = by_wire + by_plain
    assert len(messages) == 2
    assert set(by_wire[0]) == set(by_plain[0])
    for message in messages:
        assert message["Body"] == '{"task_id": "t"}'
        assert message["Attributes"] == {"ApproximateReceiveCount": "1"}
        assert message["MessageAttributes"]["traceparent"]["StringValue"] == TRACEPARENT

    first, second = messages
    assert (
        _without_metadata(
            wire.change_message_visibility(
                QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
            )
        )
        == {}
    )
    again = _receive(wire, url, most=10)["Messages"]
    assert [message["MessageId"] for message in again] == [first["MessageId"]]
    assert (
        _without_metadata(
            wire.delete_message(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"])
        )
        == {}
    )
    deleted = wire.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "0", "ReceiptHandle": second["ReceiptHandle"]},
            {"Id": "1", "ReceiptHandle": "not-a-receipt-handle"},
        ],
    )
    assert [entry["Id"] for entry in deleted["Successful"]] == ["0"]
    assert [entry["Id"] for entry in deleted["Failed"]] == ["1"]
    assert wire.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []


def _error(call: Callable[..., Any], *args: Any, **kwargs: Any) -> ClientError:
    with pytest.raises(ClientError) as raised:
        call(*args, **kwargs)
    return raised.value


def test_service_errors_are_the_ones_boto3_raises(clients: tuple[Any, Any, str]) -> None:
    wire, plain, url = clients
    for name, call in [
        ("receive_message", lambda c: c.receive_message(QueueUrl=url + "-gone")),
        (
            "change_message_visibility",
            lambda c: c.change_message_visibility(
                QueueUrl=url, ReceiptHandle="garbage", VisibilityTimeout=5
            ),
        ),
    ]:
        by_wire, by_plain = _error(call, wire), _error(call, plain)
        assert type(by_wire).__name__ == type(by_plain).__name__, name  # classes per client
        assert by_wire.response["Error"] == by_plain.response["Error"], name
        assert str(by_wire) == str(by_plain), name
    missing = _error(lambda: wire.receive_message(QueueUrl=url + "-gone"))
    assert isinstance(missing, wire.exceptions.QueueDoesNotExist)


def test_cold_calls_are_the_boto3_clients(clients: tuple[Any, Any, str]) -> None:
    wire, _, url = clients
    name = url.rsplit("/", 1)[-1]
    assert wire.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert wire.meta.service_model.service_name == "sqs"


def test_each_call_is_counted_once(clients: tuple[Any, Any, str]) -> None:
    wire, _, url = clients
    seen: list[str] = []
    wire.on_request(seen.append)
    wire.send_message_batch(QueueUrl=url, Entries=[{"Id": "0", "MessageBody": "x"}])
    wire.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    wire.get_queue_url(QueueName=url.rsplit("/", 1)[-1])  # boto3's own: not this counter's
    assert seen == ["send_message_batch", "receive_message"]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _three_attempts(plain: Any, pauses: list[float]) -> WireSqs:
    """A wire client over `plain`'s credentials that makes 3 attempts and records its pauses."""
    return WireSqs(
        plain,
        plain._request_signer._credentials,
        max_pool_connections=2,
        max_attempts=3,
        connect_timeout=1,
        read_timeout=5,
        sleep=pauses.append,
    )


def test_a_refused_connection_is_retried_then_raised_as_botocore_does() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    plain = sqs_client(settings(endpoint, sqs_wire_client=False), max_attempts=1)
    pauses: list[float] = []
    wire = _three_attempts(plain, pauses)
    with pytest.raises(EndpointConnectionError):
        wire.receive_message(QueueUrl=f"{endpoint}/000000000000/q", WaitTimeSeconds=0)
    assert len(pauses) == 2  # three attempts in all
    assert all(0 <= pause < 20 for pause in pauses)


def test_throttling_and_server_errors_are_retried_by_botocores_rules(
    clients: tuple[Any, Any, str],
) -> None:
    _, _, url = clients
    endpoint = url.split("/000000000000/", 1)[0]
    # Every receive is answered 500 InternalError or 400 ThrottlingException before the queue.
    with SqsFaultInjector(endpoint, FaultRates(fail_receive=1.0), seed=5) as injector:
        proxied = sqs_client(settings(injector.url, sqs_wire_client=False), max_attempts=1)
        pauses: list[float] = []
        error = _error(_three_attempts(proxied, pauses).receive_message, QueueUrl=url)
        assert injector.counts["failed_receives"] == 3
    assert error.response["Error"]["Code"] in {"InternalError", "ThrottlingException"}
    assert len(pauses) == 2


def test_a_client_error_is_not_retried(clients: tuple[Any, Any, str]) -> None:
    _, plain, url = clients
    pauses: list[float] = []
    wire = _three_attempts(plain, pauses)
    _error(lambda: wire.receive_message(QueueUrl=url + "-gone"))
    assert pauses == []


def test_the_wire_client_can_be_turned_off(sqs_endpoint_url: str) -> None:
    assert not isinstance(sqs_client(settings(sqs_endpoint_url, sqs_wire_client=False)), WireSqs)
    assert isinstance(sqs_client(settings(sqs_endpoint_url)), WireSqs)

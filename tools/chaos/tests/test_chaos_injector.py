"""The SQS fault injector of `make chaos`: transparent when it injects nothing, and each fault kind
at its configured rate (with a seed) against a real SQS endpoint (LocalStack).

Rates are checked against the injector's own exact counts (what the queue holds, what the client
saw) and, loosely, against the binomial expectation (five standard deviations).
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from taskplat.chaos.injector import FaultRates, SqsFaultInjector
from taskplat.devstack.sqs import sqs_client

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})


def _near(observed: int, trials: int, rate: float) -> bool:
    mean = trials * rate
    return abs(observed - mean) <= 5 * math.sqrt(trials * rate * (1 - rate)) + 1


# -- transparency -------------------------------------------------------------------------------


class _Recorder:
    """An upstream HTTP server that records each request and answers a fixed reply."""

    def __init__(self, reply_headers: list[tuple[str, str]], reply_body: bytes) -> None:
        self.requests: list[tuple[str, str, list[tuple[str, str]], bytes]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                recorder.requests.append(
                    (self.command, self.path, list(self.headers.items()), body)
                )
                self.send_response_only(207, "Odd Status")
                for name, value in reply_headers:
                    self.send_header(name, value)
                self.end_headers()
                if "chunked" in str(reply_headers).lower():
                    for piece in (reply_body[:5], reply_body[5:]):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.wfile.write(reply_body)

            do_POST = do_GET = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _request(
    url: str, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, str, list[tuple[str, str]], bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.reason, response.getheaders(), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("chunked", [False, True])
def test_requests_and_answers_pass_byte_for_byte(chunked: bool) -> None:
    body_out = bytes(range(256)) * 3
    reply_headers = [("Content-Type", "application/octet-stream"), ("X-Odd", "a  b")]
    if chunked:
        reply_headers.append(("Transfer-Encoding", "chunked"))
    else:
        reply_headers.append(("Content-Length", str(len(body_out))))
    upstream = _Recorder(reply_headers, body_out)
    # Every fault at its maximum: none of them applies to what is not an SQS action it knows.
    rates = FaultRates(lose=1.0, fail_receive=1.0, fail_delete=1.0)
    sent_body = b'{"MessageBody": "x"}\x00\xff'
    headers = {
        "Host": "sqs.example:4566",
        "Accept-Encoding": "identity",
        "X-Amz-Target": "AmazonSQS.ListQueues",
        "Content-Type": "application/x-amz-json-1.0",
        "X-Custom": "spaced  value",
    }
    try:
        direct = _request(upstream.url, "POST", "/some/path?q=1", headers, sent_body)
        with SqsFaultInjector(upstream.url, rates, seed=1) as injector:
            proxied = _request(injector.url, "POST", "/some/path?q=1", headers, sent_body)
            _request(injector.url, "GET", "/other", {"Host": "h", "X-A": "1"}, b"")
            assert injector.counts == {"action:ListQueues": 1}
        # The upstream saw the same request from the proxy as from the client itself.
        assert upstream.requests[1] == upstream.requests[0]
        assert upstream.requests[0][3] == sent_body
        assert upstream.requests[2][:2] == ("GET", "/other")
        assert proxied[:2] == direct[:2] == (207, "Odd Status")
        assert proxied[3] == direct[3] == body_out
        expected = [h for h in direct[2] if h[0] != "Transfer-Encoding"]
        if chunked:
            expected.append(("Content-Length", str(len(body_out))))
        assert proxied[2] == expected
    finally:
        upstream.close()


# -- faults against LocalStack -----------------------------------------------------------------


@pytest.fixture
def queue(sqs_endpoint_url: str) -> Iterator[tuple[SQSClient, str]]:
    client = sqs_client(sqs_endpoint_url)
    url = client.create_queue(
        QueueName=f"chaos-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "300"}
    )["QueueUrl"]
    try:
        yield client, url
    finally:
        client.delete_queue(QueueUrl=url)
        client.close()


def _drain(client: SQSClient, url: str, expected: int, timeout: float = 30.0) -> list[str]:
    """Receive every message (none reappears: the visibility timeout is long), waiting until
    `expected` arrived and then until a receive comes back empty."""
    bodies: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        bodies += [m["Body"] for m in messages]
        if not messages and len(bodies) >= expected:
            return bodies
    raise AssertionError(f"only {len(bodies)} of at least {expected} messages arrived")


def _send_all(client: SQSClient, url: str, singles: int, batches: int) -> list[str]:
    bodies: list[str] = []
    for n in range(singles):
        body = json.dumps({"n": n})
        answer = client.send_message(QueueUrl=url, MessageBody=body)
        assert answer["MessageId"] and answer["MD5OfMessageBody"]
        bodies.append(body)
    for b in range(batches):
        entries = [{"Id": f"e{i}", "MessageBody": json.dumps({"b": b, "i": i})} for i in range(10)]
        answer = client.send_message_batch(QueueUrl=url, Entries=entries)  # type: ignore[arg-type]
        assert sorted(s["Id"] for s in answer["Successful"]) == sorted(e["Id"] for e in entries)
        assert not answer.get("Failed")
        bodies += [e["MessageBody"] for e in entries]
    return bodies


def test_lost_messages_are_answered_as_sent_and_never_arrive(
    sqs_endpoint_url: str, queue: tuple[SQSClient, str]
) -> None:
    direct, url = queue
    counts = []
    for _ in range(2):  # the same seed makes the same decisions
        with SqsFaultInjector(sqs_endpoint_url, FaultRates(lose=0.3), seed=7) as injector:
            proxied = sqs_client(injector.url, config=NO_RETRIES)
            sent = _send_all(proxied, url, singles=20, batches=8)
            proxied.close()
            lost = injector.counts.get("lost", 0)
        arrived = _drain(direct, url, len(sent) - lost)
        assert len(arrived) == len(sent) - lost
        assert set(arrived) <= set(sent) and len(set(arrived)) == len(arrived)
        assert _near(lost, len(sent), 0.3), lost
        counts.append(lost)
    assert counts[0] == counts[1]


def test_duplicated_messages_arrive_twice(
    sqs_endpoint_url: str, queue: tuple[SQSClient, str]
) -> None:
    direct, url = queue
    with SqsFaultInjector(sqs_endpoint_url, FaultRates(duplicate=0.25), seed=3) as injector:
        proxied = sqs_client(injector.url, config=NO_RETRIES)
        sent = _send_all(proxied, url, singles=20, batches=8)
        proxied.close()
        duplicated = injector.counts["duplicated"]
    arrived = Counter(_drain(direct, url, len(sent) + duplicated))
    assert sum(arrived.values()) == len(sent) + duplicated
    assert set(arrived) == set(sent)
    assert sum(1 for n in arrived.values() if n == 2) == duplicated
    assert max(arrived.values()) <= 2
    assert _near(duplicated, len(sent), 0.25), duplicated


def test_receives_and_deletes_fail_at_their_rates(
    sqs_endpoint_url: str, queue: tuple[SQSClient, str]
) -> None:
    direct, url = queue
    for n in range(40):
        direct.send_message(QueueUrl=url, MessageBody=str(n))
    rates = FaultRates(fail_receive=0.4, fail_delete=0.4)
    with SqsFaultInjector(sqs_endpoint_url, rates, seed=11) as injector:
        proxied = sqs_client(injector.url, config=NO_RETRIES)
        errors: Counter[str] = Counter()
        handles: list[str] = []
        receives = 0
        deadline = time.monotonic() + 60
        while len(handles) < 40 and time.monotonic() < deadline:
            receives += 1
            try:
                reply = proxied.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1
                )
            except ClientError as exc:
                errors[exc.response["Error"]["Code"]] += 1
                continue
            handles += [m["ReceiptHandle"] for m in reply.get("Messages", [])]
        assert len(handles) == 40  # a failed receive took nothing from the queue
        failed_deletes = 0
        for handle in handles:
            try:
                proxied.delete_message(QueueUrl=url, ReceiptHandle=handle)
            except ClientError as exc:
                errors[exc.response["Error"]["Code"]] += 1
                failed_deletes += 1
        proxied.close()
        counts = injector.counts
    assert counts["failed_deletes"] == failed_deletes
    assert sum(errors.values()) == counts["failed_receives"] + failed_deletes
    assert set(errors) <= {"InternalError", "ThrottlingException"} and len(errors) == 2
    assert _near(counts["failed_receives"], receives, 0.4), (counts, receives)
    assert _near(failed_deletes, 40, 0.4), failed_deletes
    left = direct.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
    assert int(left) == failed_deletes  # a failed delete deleted nothing


def test_retrying_clients_ride_out_the_failures_and_rates_can_be_turned_off(
    sqs_endpoint_url: str, queue: tuple[SQSClient, str]
) -> None:
    direct, url = queue
    rates = FaultRates(fail_receive=0.3, fail_delete=0.3)
    with SqsFaultInjector(sqs_endpoint_url, rates, seed=5) as injector:
        proxied = sqs_client(injector.url)  # botocore's retries, as the services have
        direct.send_message(QueueUrl=url, MessageBody="m")
        messages = proxied.receive_message(QueueUrl=url, WaitTimeSeconds=2).get("Messages", [])
        assert [m["Body"] for m in messages] == ["m"]
        proxied.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
        injector.set_rates(FaultRates())
        before = injector.counts
        for _ in range(20):
            proxied.receive_message(QueueUrl=url, WaitTimeSeconds=0)
        assert injector.counts.get("failed_receives", 0) == before.get("failed_receives", 0)
        proxied.close()

"""The transport floor of W2: one message sent and received through the bench stack's own SQS
endpoint by a plain client, at W2's rate, so W2 can be read against what SQS alone costs.

Invariants:
- The probe uses a queue of its own (`<prefix>bench-floor`, created if missing, purged first), on
  the same endpoint the services use, so it never sees a wake-up and no service sees its messages.
- One plain boto3 client sends (SendMessage, one message each, paced at `rate` per second from
  one thread, as W2's client paces its POSTs) and another long-polls (ReceiveMessage, wait 20 s,
  up to 10 messages) on its own thread; a message's latency is the receiver's `time.time()` when
  the receive returned minus the sender's just before the send (one machine, one clock). Deletes
  are batched and not timed.
- Nothing of the services runs differently while the probe runs (the stack is idle), so the
  figure is the transport alone: signing, the HTTP round trips and the server's own work.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from taskplat.bench.client import BenchError
from taskplat.bench.stats import percentile
from taskplat.devstack.sqs import sqs_client

if TYPE_CHECKING:
    from taskplat.bench.harness import BenchStack

FLOOR_QUEUE = "bench-floor"
RECEIVE_WAIT_SECONDS = 20


def measure_floor(bs: BenchStack, *, n: int, rate: float) -> dict[str, Any]:
    """Send `n` messages at `rate`/s through the stack's SQS endpoint; p50/p95/p99 in ms."""
    stack = bs.running()
    endpoint, region = stack.info.sqs_endpoint_url, stack.config.aws_region
    sender, receiver = sqs_client(endpoint, region), sqs_client(endpoint, region)
    url = sender.create_queue(QueueName=f"{stack.config.queue_prefix}{FLOOR_QUEUE}")["QueueUrl"]
    sender.purge_queue(QueueUrl=url)
    latencies: list[float] = []
    done = threading.Event()
    failure: list[BaseException] = []

    def receive() -> None:
        try:
            while not done.is_set() and len(latencies) < n:
                answer = receiver.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=RECEIVE_WAIT_SECONDS if not done.is_set() else 0,
                )
                now = time.time()
                messages = answer.get("Messages", [])
                for message in messages:
                    latencies.append((now - float(message["Body"])) * 1000)
                if messages:
                    receiver.delete_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                            for i, m in enumerate(messages)
                        ],
                    )
        except BaseException as exc:  # reported by the caller
            failure.append(exc)

    thread = threading.Thread(target=receive, name="bench-floor-receive", daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # the receiver's first long poll is open
        start = time.monotonic()
        for index in range(n):
            due = start + index / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            now = time.time()
            sender.send_message(QueueUrl=url, MessageBody=repr(now))
        deadline = time.monotonic() + 30
        while len(latencies) < n and time.monotonic() < deadline and not failure:
            time.sleep(0.05)
    finally:
        done.set()
        thread.join(timeout=RECEIVE_WAIT_SECONDS + 5)
        sender.close()
        receiver.close()
    if failure:
        raise BenchError(f"the SQS floor probe failed: {failure[0]}")
    if len(latencies) < n:
        raise BenchError(f"the SQS floor probe received {len(latencies)} of {n} messages")
    ordered = sorted(latencies)
    return {
        "messages": n,
        "rate": rate,
        "p50_ms": round(percentile(ordered, 50), 2),
        "p95_ms": round(percentile(ordered, 95), 2),
        "p99_ms": round(percentile(ordered, 99), 2),
        "max_ms": round(ordered[-1], 2),
    }

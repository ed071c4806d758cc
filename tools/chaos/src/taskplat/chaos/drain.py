"""The end of a chaos run: wait, within `drain_seconds` of the faults stopping, for every task to
complete, then for the task queue's SQS queue to hold no wake-up.

Invariants: only reads (the progress query given, SQS's queue attributes); a progress line at
most every 10 s; a wait that times out is a note of the result, never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from taskplat.chaos.config import ChaosConfig
from taskplat.devstack.sqs import sqs_client
from taskplat.devstack.stack import Stack
from taskplat.devstack.waiting import wait_for

Say = Callable[[str], None]
Progress = Callable[[], list[dict[str, Any]] | None]


def drain(
    config: ChaosConfig, stack: Stack, progress: Progress, say: Say, since: float
) -> tuple[float | None, bool, list[str]]:
    """Seconds from `since` until every task completed (None: not within the time), whether the
    task queue was empty at the end, and the notes of what did not happen."""
    deadline = since + config.drain_seconds
    notes: list[str] = []

    reported = [time.monotonic()]

    def every_10s(text: Callable[[], str]) -> None:
        if time.monotonic() - reported[0] >= 10:
            reported[0] = time.monotonic()
            say(text())

    def all_completed() -> bool:
        rows = progress()
        if rows:
            every_10s(lambda: f"chaos: {rows[0]['completed']} of {config.tasks} completed")
        return rows is not None and bool(rows) and rows[0]["completed"] == config.tasks

    try:
        wait_for(
            all_completed,
            timeout=max(deadline - time.monotonic(), 0.1),
            what="every task to complete",
            interval=0.2,
        )
    except TimeoutError:
        notes.append(f"not every task completed within {config.drain_seconds:g}s")
        return None, False, notes
    drained = round(time.monotonic() - since, 1)
    client = sqs_client(stack.info.sqs_endpoint_url, stack.config.aws_region)
    try:
        url = client.get_queue_url(QueueName=f"{stack.config.queue_prefix}default")["QueueUrl"]

        def queue_empty() -> bool:
            attributes = client.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"]
            left = sum(int(v) for v in attributes.values())
            every_10s(lambda: f"chaos: every task completed; {left} wake-ups left in SQS")
            return left == 0

        try:
            wait_for(
                queue_empty,
                timeout=max(deadline - time.monotonic(), 30.0),
                what="the task queue to empty",
                interval=0.5,
            )
        except TimeoutError:
            notes.append("the task queue still held wake-ups at the end")
            return drained, False, notes
    finally:
        client.close()
    return drained, True, notes

"""The steady load of a soak, from one thread: plain tasks at `rate` per second
(`POST /tasks/batch`), a run of the DAG's `produce` job every `job_every` seconds
(`POST /dags/{dag}/jobs/produce/runs`), and `records_per_second` records published to the buffered
dataset's SQS buffer (10 records per message), which the sink writes and whose events start the
DAG's `react` job.

Invariants:
- The schedule is absolute: after `t` seconds, `floor(rate * t)` tasks are due; a late tick
  catches up (never more than one batch call of 100 per due 100), so the average rate holds;
  unless stopped early, exactly `floor(rate * duration)` tasks are sent in all.
- Calls are retried on transport errors and 5xx for up to `RETRY_SECONDS`; a call that still
  fails, or that gets a 4xx, is counted in `failures` (the soak fails on any) and the load goes on.
- The thread only speaks HTTP and SQS; it starts and stops nothing.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

BATCH = 100
TICK_SECONDS = 0.25
RETRY_SECONDS = 30.0
RECORDS_PER_MESSAGE = 10
ORG = "00000000-0000-4000-8000-00000000500a"


class SteadyLoad(threading.Thread):
    def __init__(
        self,
        api: httpx.Client,
        sqs: SQSClient,
        *,
        rate: float,
        duration: float,
        dag: str,
        job_every: float,
        records_per_second: float,
        dataset: dict[str, Any],
    ) -> None:
        super().__init__(name="soak-load", daemon=True)
        self.api = api
        self.sqs = sqs
        self.rate = rate
        self.duration = duration
        self.dag = dag
        self.job_every = job_every
        self.records_per_second = records_per_second
        self.dataset = dataset
        self.stop = threading.Event()
        self.sent: Counter[str] = Counter()  # tasks, job_runs, records
        self.failures: list[str] = []
        self.started_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the soak; the thread must not die silently
            self.error = exc

    def _run(self) -> None:
        started = self.started_at = time.monotonic()
        ticks = 0
        while not self.stop.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= self.duration:
                break
            self._tasks(min(math.floor(self.rate * elapsed), math.floor(self.rate * self.duration)))
            if self.job_every > 0 and self.sent["job_runs"] <= elapsed / self.job_every:
                self._job_run()
            due_records = math.floor(self.records_per_second * elapsed / RECORDS_PER_MESSAGE)
            if self.sent["record_messages"] < due_records:
                self._records(due_records - self.sent["record_messages"])
            ticks += 1
            self.stop.wait(max(0.0, started + ticks * TICK_SECONDS - time.monotonic()))
        if not self.stop.is_set():  # the last tick's due, so the totals are exact
            self._tasks(math.floor(self.rate * self.duration))
            due_records = math.floor(self.records_per_second * self.duration / RECORDS_PER_MESSAGE)
            if self.sent["record_messages"] < due_records:
                self._records(due_records - self.sent["record_messages"])

    def _call(self, what: str, send: Any) -> httpx.Response | None:
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            try:
                response: httpx.Response = send()
            except httpx.TransportError as exc:
                problem = f"{what}: {exc!r}"
            else:
                if response.status_code < 400:
                    return response
                problem = f"{what}: {response.status_code} {response.text[:200]}"
                if response.status_code < 500:
                    break
            if time.monotonic() >= deadline or self.stop.is_set():
                break
            time.sleep(0.5)
        self.failures.append(problem)
        return None

    def _tasks(self, due: int) -> None:
        while self.sent["tasks"] < due:
            n = min(BATCH, due - self.sent["tasks"])
            body = {"tasks": [{"operator": "echo", "config": {"soak": True}} for _ in range(n)]}
            self._call(
                "POST /tasks/batch", lambda body=body: self.api.post("/tasks/batch", json=body)
            )
            self.sent["tasks"] += n  # counted when attempted: a failure is in `failures`

    def _job_run(self) -> None:
        path = f"/dags/{self.dag}/jobs/produce/runs"
        if self._call(f"POST {path}", lambda: self.api.post(path, json={})) is not None:
            self.sent["job_runs_created"] += 1
        self.sent["job_runs"] += 1

    def _records(self, messages: int) -> None:
        view = self.dataset
        entries: list[dict[str, str]] = []
        for _ in range(messages):
            number = self.sent["record_messages"]
            records = [
                {"org_id": ORG, "dedupe_key": f"m{number}-{i}", "severity": "info", "value": i}
                for i in range(RECORDS_PER_MESSAGE)
            ]
            body = {
                "dataset_uuid": view["dataset_uuid"],
                "schema_hash": view["schema_hash"],
                "records": records,
            }
            entries.append({"Id": str(len(entries)), "MessageBody": json.dumps(body)})
            self.sent["record_messages"] += 1
            if len(entries) == 10:
                self._send(entries)
                entries = []
        if entries:
            self._send(entries)

    def _send(self, entries: list[dict[str, str]]) -> None:
        try:
            answer = self.sqs.send_message_batch(
                QueueUrl=self.dataset["buffer_queue_url"],
                Entries=entries,  # type: ignore[arg-type]
            )
        except Exception as exc:  # botocore's errors have no common base worth naming here
            self.failures.append(f"SendMessageBatch to the buffer: {exc!r}")
            return
        if answer.get("Failed"):
            self.failures.append(f"SendMessageBatch to the buffer: {answer['Failed'][:1]}")
            return
        self.sent["records"] += RECORDS_PER_MESSAGE * len(entries)

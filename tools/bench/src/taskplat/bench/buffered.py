"""W5: records through buffered Postgres datasets. A DAG with a buffered dataset and an `echo` job
reading it; `w5_records` records (`w5_batch` per SQS message, a share `w5_duplicates` of them
repeating keys sent before) published with plain SendMessageBatch calls to the buffer, drained by
two sink replicas.

Figures: `records_per_second` (records published / seconds from the first publish to the last
distinct row written), `p99_publish_to_routed_ms` and `p50_...` (per distinct record: from the
first publish of its key to the creation of the first downstream task of an event whose cursor
covers its row), `exactly_once` (every distinct key is in the table once).

Invariants: the workload reads the database only (bench.sql and the dataset table, named through
psycopg.sql); its DAG and dataset are new for every run (the run number in their names).
"""

from __future__ import annotations

import bisect
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
from psycopg import sql

from taskplat.bench.config import Sizes
from taskplat.bench.harness import BenchStack
from taskplat.bench.stats import percentile
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.sqs import sqs_client
from taskplat.devstack.waiting import wait_for

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

ORG = "00000000-0000-4000-8000-0000000000b5"
_runs = iter(range(1, 1_000_000))


def _dag(dataset: str) -> dict[str, Any]:
    return {
        "jobs": {
            "produce": {
                "operator": "echo",
                "outputs": [{"index": 0, "dataset": dataset, "kind": "buffered_postgres",
                             "schema": [{"name": "severity", "type": "text"},
                                        {"name": "value", "type": "bigint"}]}],
            },
            "react": {"operator": "echo", "inputs": [{"from": {"dataset": dataset}}]},
        }
    }  # fmt: skip


def _messages(sizes: Sizes, seed: int) -> list[list[str]]:
    """Keys per message: each message `w5_batch` records, a share of them repeats of earlier
    keys (or of its own, in the first message)."""
    rng = random.Random(seed)
    batch = sizes.w5_batch
    repeats = round(batch * sizes.w5_duplicates)
    messages: list[list[str]] = []
    sent: list[str] = []
    for m in range(sizes.w5_records // batch):
        fresh = [f"k{m}-{i}" for i in range(batch - repeats)]
        pool = sent or fresh
        keys = fresh + [rng.choice(pool) for _ in range(repeats)]
        sent += fresh
        messages.append(keys)
    return messages


def _publish(
    sqs: SQSClient, queue_url: str, view: dict[str, Any], messages: list[list[str]]
) -> dict[str, float]:
    """Send every message (10 per SendMessageBatch, 8 calls at once); the first publish time of
    each key."""
    first: dict[str, float] = {}

    def body(keys: list[str]) -> str:
        records = [{"org_id": ORG, "dedupe_key": k, "severity": "info", "value": n}
                   for n, k in enumerate(keys)]  # fmt: skip
        message = {"dataset_uuid": view["dataset_uuid"], "schema_hash": view["schema_hash"],
                   "records": records}  # fmt: skip
        return json.dumps(message, separators=(",", ":"))

    def send(chunk: list[list[str]]) -> float:
        entries = [{"Id": str(i), "MessageBody": body(keys)} for i, keys in enumerate(chunk)]
        sent_at = time.time()
        answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)  # type: ignore[arg-type]
        if answer.get("Failed"):
            raise DevstackError(f"W5: SQS refused buffer messages: {answer['Failed'][:1]}")
        return sent_at

    chunks = [messages[i : i + 10] for i in range(0, len(messages), 10)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        times = list(pool.map(send, chunks))
    for chunk, sent_at in zip(chunks, times, strict=True):
        for keys in chunk:
            for key in keys:
                first.setdefault(key, sent_at)
                first[key] = min(first[key], sent_at)
    return first


def measure_buffered(bs: BenchStack, sizes: Sizes, label: str) -> dict[str, Any]:
    run = next(_runs)
    dataset = f"w5-{run}"
    with httpx.Client(base_url=bs.dispatcher_url, headers=bs.headers, timeout=30) as api:
        applied = api.put(f"/dags/{dataset}", json=_dag(dataset))
        if applied.status_code != 201:
            raise DevstackError(f"W5: applying the DAG failed: {applied.text[:300]}")
        uuid = next(d for d in api.get("/datasets").json()["datasets"] if d["name"] == dataset)[
            "dataset_uuid"
        ]

        def ready() -> dict[str, Any]:
            view: dict[str, Any] = api.get(f"/datasets/{uuid}").json()
            return view if view["buffer_queue_url"] else {}

        view = wait_for(ready, timeout=60, what="W5: the sink creating the buffer")
    messages = _messages(sizes, run)
    distinct = {key for keys in messages for key in keys}
    table = view["location"].removeprefix("postgres_table:")
    count = sql.SQL("SELECT count(*) AS n, count(DISTINCT dedupe_key) AS d FROM {}").format(
        sql.Identifier(table)
    )
    sqs = sqs_client(bs.running().info.sqs_endpoint_url)
    try:
        started = time.time()
        first = _publish(sqs, view["buffer_queue_url"], view, messages)
        published = time.time()

        def written() -> bool:
            row = bs.execute(count)[0]
            return int(row["n"]) >= len(distinct)

        wait_for(written, timeout=900, interval=0.05, what=f"{label}: every record written")
        drained = time.time()
    finally:
        sqs.close()
    row = bs.execute(count)[0]
    rows = bs.execute(sql.SQL("SELECT row_id, dedupe_key FROM {}").format(sql.Identifier(table)))

    def routed() -> list[dict[str, Any]]:
        found = bs.query("w5_routed", dataset_uuid=uuid)
        top = max((r["row_id"] for r in rows), default=0)
        return found if found and found[-1]["cursor"] >= top else []

    events = wait_for(routed, timeout=120, interval=0.1, what=f"{label}: every row routed")
    cursors = [event["cursor"] for event in events]
    latencies: list[float] = []
    for item in rows:
        index = bisect.bisect_left(cursors, item["row_id"])
        routed_at = events[index]["routed_at"].timestamp()
        latencies.append((routed_at - first[item["dedupe_key"]]) * 1000)
    latencies.sort()
    records = sum(len(keys) for keys in messages)
    return {
        "records": records,
        "distinct_records": len(distinct),
        "publish_seconds": round(published - started, 3),
        "records_per_second": round(records / (drained - started), 1),
        "p50_publish_to_routed_ms": round(percentile(latencies, 50), 1),
        "p99_publish_to_routed_ms": round(percentile(latencies, 99), 1),
        "events": len(events),
        "exactly_once": int(row["n"]) == int(row["d"]) == len(distinct),
    }

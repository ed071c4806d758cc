"""W6: the query service scanning a buffered dataset. A DAG with a buffered dataset of
`w6_rows` rows (written straight into its table: the setup is not measured), then `w6_queries`
`SELECT *` of it through `POST /query`, `w6_clients` at once, each with a capability token of its
own (a task pinned to the dataset, signed with the stack's capability key), as untrusted
operators would.

Figures: `queries_per_second` (queries / seconds from the first request to the last answer),
`p50_ms` and `p99_ms` (request to whole answer, at the client), `rows` (per answer: the scan's
rows, checked on every answer), `cpu_ms_per_query` (the query service process's CPU time over the
run, per query).

Invariants: the workload writes the dataset table only before it measures; every answer must be
a 200 holding all `w6_rows` rows, else the workload fails.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from psycopg import sql

from taskplat.bench.config import Sizes
from taskplat.bench.harness import BenchStack
from taskplat.bench.probes import own_cpu_seconds
from taskplat.bench.stats import percentile
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.stack.data_services import DATA_BUCKET, capability_env

SERVICE = "query-service"
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
        }
    }  # fmt: skip


def _minter(worker_token: str) -> Any:
    """A function minting a capability token pinning one dataset version, as the dispatcher."""
    from pydantic import SecretStr

    from taskplat.common.tokens.capability import (
        StorageLayout,
        build_capability,
        capability_key_ring,
        issue_capability_token,
    )
    from taskplat.common.tokens.keys import TokenKeySettings

    env = capability_env(worker_token)
    keys = json.loads(env["TASKPLAT_CAPABILITY_TOKEN_KEYS"])
    kid = env["TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID"]
    ring = capability_key_ring(
        TokenKeySettings(keys={k: SecretStr(v) for k, v in keys.items()}, active_kid=kid)
    )

    def mint(dataset_uuid: str, version: str) -> str:
        pin = {"dataset_uuid": dataset_uuid, "dataset_version": version, "cursor": 0}
        capability = build_capability(uuid.uuid4(), 1, [pin], [], layout=StorageLayout(DATA_BUCKET))
        now = datetime.now(UTC)
        return issue_capability_token(
            ring, capability, now=now, expires_at=now + timedelta(minutes=30)
        )

    return mint


def measure_query(bs: BenchStack, sizes: Sizes, label: str) -> dict[str, Any]:
    stack = bs.running()
    query_url = stack.info.query_url
    if query_url is None:
        raise DevstackError("W6: the stack runs no query service")
    run = next(_runs)
    dataset = f"w6_{run}"
    with httpx.Client(base_url=bs.dispatcher_url, headers=bs.headers, timeout=30) as api:
        applied = api.put(f"/dags/{dataset.replace('_', '-')}", json=_dag(dataset))
        if applied.status_code != 201:
            raise DevstackError(f"W6: applying the DAG failed: {applied.text[:300]}")
        view = next(d for d in api.get("/datasets").json()["datasets"] if d["name"] == dataset)
        view = api.get(f"/datasets/{view['dataset_uuid']}").json()
    table = view["location"].removeprefix("postgres_table:")
    written = bs.execute(
        sql.SQL(
            "WITH written AS (INSERT INTO {} (org_id, dedupe_key, severity, value) "
            "SELECT '00000000-0000-4000-8000-0000000000b6', 'k' || n, 'info', n "
            "FROM generate_series(1, {}) AS n RETURNING 1) SELECT count(*) AS n FROM written"
        ).format(sql.Identifier(table), sql.Literal(sizes.w6_rows))
    )
    if written[0]["n"] != sizes.w6_rows:
        raise DevstackError(f"W6 {label}: wrote {written[0]['n']} rows, not {sizes.w6_rows}")
    mint = _minter(stack.info.worker_token)
    tokens = [mint(view["dataset_uuid"], view["current_version"]) for _ in range(sizes.w6_queries)]
    statement = {"sql": f"SELECT * FROM {dataset}", "max_rows": sizes.w6_rows}
    pid = stack.pids()[SERVICE]
    latencies: list[float] = []

    def one(client: httpx.Client, token: str) -> float:
        sent = time.monotonic()
        answer = client.post("/query", headers={"Authorization": f"Bearer {token}"}, json=statement)
        took = time.monotonic() - sent
        if answer.status_code != 200:
            raise DevstackError(f"W6: {answer.status_code} {answer.text[:300]}")
        if answer.json()["row_count"] != sizes.w6_rows:
            raise DevstackError(f"W6: an answer held {answer.json()['row_count']} rows")
        return took

    with httpx.Client(base_url=query_url, timeout=120) as client:
        one(client, mint(view["dataset_uuid"], view["current_version"]))  # warm
        cpu_before = own_cpu_seconds(pid)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=sizes.w6_clients) as pool:
            latencies = list(pool.map(lambda token: one(client, token), tokens))
        elapsed = time.monotonic() - started
        cpu = own_cpu_seconds(pid) - cpu_before
    latencies.sort()
    return {
        "queries": len(tokens),
        "rows": sizes.w6_rows,
        "clients": sizes.w6_clients,
        "queries_per_second": round(len(tokens) / elapsed, 2),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "cpu_ms_per_query": round(cpu * 1000 / len(tokens), 1),
    }

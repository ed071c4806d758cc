"""W6: the query service as an untrusted operator meets it. A DAG with a buffered dataset of
`w6_rows` rows (written straight into its table: the setup is not measured), then one aggregate
of it (`STATEMENT`: a GROUP BY over every row, a few rows answered) through `POST /query`:

- sequential: `w6_sequential` queries one after the other with one capability token (a task
  pinned to the dataset, signed with the stack's capability key), as one operator would;
- concurrent: for each count of `w6_clients`, `w6_queries` queries from that many clients at
  once, each client with a capability token of its own (so the per-token rate limit is not what
  is measured);
- the floor: the same statement `w6_sequential` times straight on Postgres with psycopg, in the
  same run.

Figures: `sequential_p50_ms`/`p90`/`p99` (request to whole answer, at the client),
`queries_per_second` and `p50_ms`/`p99_ms` at the first client count, `queries_per_second_<n>` at
each, `cpu_ms_per_query` (the query service's CPU over the first concurrent phase, per query: its
process, its fork server and the sandboxes, reaped or alive), `cpu_ms_per_query_sequential`, and
`postgres_p50_ms`/`p90`/`p99` with `p50_over_postgres`.

Invariants: the workload writes the dataset table only before it measures; every answer must be
a 200 with the statement's rows (the same as Postgres answers), else the workload fails.
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
from taskplat.bench.probes import tree_cpu_seconds
from taskplat.bench.stats import percentile
from taskplat.devstack.attempts import end_attempts, running_attempt
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


def _minter(worker_token: str, database_url: str) -> tuple[Any, list[uuid.UUID]]:
    """A function minting a capability token pinning one dataset version, as the dispatcher:
    each for a new attempt running now whose task pins that version (the database reads
    nothing for any other); and the tasks of those attempts, to end once measured."""
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

    minted: list[uuid.UUID] = []

    def mint(dataset_uuid: str, version: str) -> str:
        pin = {"dataset_uuid": dataset_uuid, "dataset_version": version, "cursor": 0}
        task_id = running_attempt(database_url, [pin])
        minted.append(task_id)
        capability = build_capability(task_id, 1, [pin], [], layout=StorageLayout(DATA_BUCKET))
        now = datetime.now(UTC)
        return issue_capability_token(
            ring, capability, now=now, expires_at=now + timedelta(minutes=30)
        )

    return mint, minted


GROUPS = 4
STATEMENT = (
    "SELECT severity, count(*) AS n, sum(value) AS total, avg(value) AS mean "
    "FROM {} GROUP BY severity ORDER BY severity"
)


def _figures(latencies: list[float]) -> dict[str, float]:
    latencies = sorted(latencies)
    return {f"p{q}_ms": round(percentile(latencies, q) * 1000, 2) for q in (50, 90, 99)}


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
            "SELECT '00000000-0000-4000-8000-0000000000b6', 'k' || n, 's' || (n % {}), n "
            "FROM generate_series(1, {}) AS n RETURNING 1) SELECT count(*) AS n FROM written"
        ).format(sql.Identifier(table), sql.Literal(GROUPS), sql.Literal(sizes.w6_rows))
    )
    if written[0]["n"] != sizes.w6_rows:
        raise DevstackError(f"W6 {label}: wrote {written[0]['n']} rows, not {sizes.w6_rows}")
    floor, expected = _postgres_floor(bs, table, sizes.w6_sequential)
    mint, minted = _minter(stack.info.worker_token, stack.info.database_url)
    try:
        return _measure(query_url, stack, sizes, mint, dataset, view, floor, expected)
    finally:  # the attempts the tokens were minted for would hold the stack's tasks Running
        end_attempts(stack.info.database_url, minted)


def _measure(
    query_url: str,
    stack: Any,
    sizes: Sizes,
    mint: Any,
    dataset: str,
    view: dict[str, Any],
    floor: dict[str, float],
    expected: list[list[Any]],
) -> dict[str, Any]:
    """The measured part of W6, with `mint` for the tokens."""
    pin = (view["dataset_uuid"], view["current_version"])
    statement = {"sql": STATEMENT.format(dataset)}
    pid = stack.pids()[SERVICE]

    def one(client: httpx.Client, token: str) -> float:
        sent = time.monotonic()
        answer = client.post("/query", headers={"Authorization": f"Bearer {token}"}, json=statement)
        took = time.monotonic() - sent
        if answer.status_code != 200:
            raise DevstackError(f"W6: {answer.status_code} {answer.text[:300]}")
        rows = [[r[0], r[1], r[2]] for r in answer.json()["rows"]]
        if rows != expected:
            raise DevstackError(f"W6: an answer held {rows[:4]}, not {expected[:4]}")
        return took

    figures: dict[str, Any] = {"rows": sizes.w6_rows, "queries": sizes.w6_queries}
    with httpx.Client(base_url=query_url, timeout=120) as client:
        token = mint(*pin)
        for _ in range(3):
            one(client, token)  # warm: the pool of sandboxes, the connections
        cpu_before = tree_cpu_seconds(pid)
        sequential = [one(client, token) for _ in range(sizes.w6_sequential)]
        cpu = tree_cpu_seconds(pid) - cpu_before
        figures.update({f"sequential_{k}": v for k, v in _figures(sequential).items()})
        figures["cpu_ms_per_query_sequential"] = round(cpu * 1000 / len(sequential), 2)
    for index, clients in enumerate(sizes.w6_clients):
        tokens = [mint(*pin) for _ in range(clients)]
        per_client = max(1, sizes.w6_queries // clients)
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        with httpx.Client(base_url=query_url, timeout=120, limits=limits) as client:

            def serve(token: str, c: httpx.Client = client, n: int = per_client) -> list[float]:
                return [one(c, token) for _ in range(n)]

            cpu_before = tree_cpu_seconds(pid)
            started = time.monotonic()
            with ThreadPoolExecutor(max_workers=clients) as pool:
                latencies = [t for took in pool.map(serve, tokens) for t in took]
            elapsed = time.monotonic() - started
            cpu = tree_cpu_seconds(pid) - cpu_before
        rate = round(len(latencies) / elapsed, 2)
        figures[f"queries_per_second_{clients}"] = rate
        figures[f"p50_ms_{clients}"] = _figures(latencies)["p50_ms"]
        if index == 0:
            figures.update(
                queries_per_second=rate,
                clients=clients,
                cpu_ms_per_query=round(cpu * 1000 / len(latencies), 2),
                **{k: v for k, v in _figures(latencies).items() if k != "p90_ms"},
            )
    figures.update({f"postgres_{k}": v for k, v in floor.items()})
    figures["p50_over_postgres"] = round(
        figures["sequential_p50_ms"] / max(floor["p50_ms"], 0.001), 1
    )
    return figures


def _postgres_floor(bs: BenchStack, table: str, n: int) -> tuple[dict[str, float], list[list[Any]]]:
    """The same statement straight on Postgres with psycopg (one connection, sequential), and
    its rows."""
    import psycopg

    statement = sql.SQL(STATEMENT).format(sql.Identifier(table))
    latencies: list[float] = []
    rows: list[Any] = []
    with psycopg.connect(bs.database_url, autocommit=True) as conn:
        for _ in range(3 + n):
            sent = time.monotonic()
            rows = conn.execute(statement).fetchall()
            latencies.append(time.monotonic() - sent)
    expected = [[r[0], int(r[1]), int(r[2])] for r in rows]
    return _figures(latencies[3:]), expected

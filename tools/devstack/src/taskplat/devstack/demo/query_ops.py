"""The operators of the untrusted-join part of `make demo` (run by the demo's worker wrappers).

- `demo_alerts` (trusted): publishes `config.blocks` alert records (`block`, `severity`) to its
  buffered Postgres output.
- `demo_prices` (untrusted): exchanges its capability token at the credential broker for S3
  credentials limited to its prefixes, writes one Parquet object of prices under its output's
  prefix, and emits the output's event.
- `demo_join` (untrusted): reads its two pinned inputs through the query service, joining them in
  one SELECT, and publishes the joined rows to its buffered output. It holds no database URL and
  no AWS credential: its capability token is all it has.

Invariant: each operator uses only what the wrapper gives an operator (its task, its capability
token, the platform's URLs and the allow-listed S3 endpoint).
"""

from __future__ import annotations

import io
import json
import os
import urllib.request
from typing import Any

from taskplat.lambda_runtime import Task, emit_event, publish_records, query, serve

ORG = "00000000-0000-4000-8000-000000000de0"
JOIN = (
    "SELECT a.block, a.severity, p.price FROM demo_q_alerts a "
    "JOIN demo_q_prices p ON p.block = a.block WHERE a.severity <> ? ORDER BY a.block"
)


def _alerts(task: Task) -> dict[str, Any]:
    blocks = task.config.get("blocks") or []
    records = [{"org_id": ORG, "dedupe_key": f"alert-{b['block']}", **b} for b in blocks]
    return {"published": publish_records(0, records)}


def _credentials(task: Task) -> dict[str, Any]:
    headers = {
        "Authorization": f"Bearer {os.environ['TASKPLAT_CAPABILITY_TOKEN']}",
        "Content-Type": "application/json",
    }
    if task.traceparent:  # the broker's spans join the attempt's trace
        headers["traceparent"] = task.traceparent
    request = urllib.request.Request(
        os.environ["TASKPLAT_CREDENTIALS_URL"].rstrip("/") + "/credentials",
        data=b"{}",
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        granted: dict[str, Any] = json.loads(answer.read())
    return granted


def _prices(task: Task) -> dict[str, Any]:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    granted = _credentials(task)
    output = task.outputs[0]
    mine = f"dataset/{output['dataset_uuid']}/version/{output['dataset_version']}/"
    (prefix,) = [p for p in granted["write_prefixes"] if p.endswith(mine)]
    bucket, _, key = prefix.removeprefix("s3://").partition("/")
    rows = task.config.get("prices") or []
    table = pa.table(
        {"block": [int(r["block"]) for r in rows], "price": [float(r["price"]) for r in rows]}
    )
    body = io.BytesIO()
    pq.write_table(table, body)
    s3 = boto3.session.Session().client(
        "s3",
        endpoint_url=os.environ.get("SQS_ENDPOINT_URL"),  # LocalStack serves S3 beside SQS
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=granted["access_key_id"],
        aws_secret_access_key=granted["secret_access_key"],
        aws_session_token=granted["session_token"],
    )
    s3.put_object(Bucket=bucket, Key=f"{key}part-0.parquet", Body=body.getvalue())
    emit_event(output_index=0, cursor=len(rows))
    return {"written": f"{prefix}part-0.parquet", "rows": len(rows)}


def _join(task: Task) -> dict[str, Any]:
    joined = query(JOIN, [task.config.get("skip_severity", "low")]).records()
    records = [{"org_id": ORG, "dedupe_key": f"joined-{row['block']}", **row} for row in joined]
    publish_records(0, records)
    return {"joined": joined}


HANDLERS = {"demo_alerts": _alerts, "demo_prices": _prices, "demo_join": _join}


def handle(task: Task) -> dict[str, Any]:
    return HANDLERS[task.operator](task)


if __name__ == "__main__":
    raise SystemExit(serve(handle))

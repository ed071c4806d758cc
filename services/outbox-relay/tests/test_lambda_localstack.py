"""The invoker against LocalStack's Lambda API (run by testcontainers, with the Docker socket it
needs to start function containers), when a Docker engine answers; skipped cleanly, with the
reason, when none does. An accepted invocation (202) commits the claim for `lambda:<function>`
and the row; an unknown function is refused by the real API, the claim rolled back and the row
backed off; the function's EventInvokeConfig takes `MaximumRetryAttempts: 0`."""

from __future__ import annotations

import importlib
import io
import random
import zipfile
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool
from relay_harness import make_settings

from taskplat.common.tokens.keys import private_key_pem
from taskplat.outbox_relay.lambda_invoker import Invoker, lambda_client
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.dockerprobe import docker_available
from taskplat.testkit.fixtures import TESTCONTAINERS_LOCALSTACK_IMAGE

KEYS = {"k1": private_key_pem(b"\x21" * 32)}
DAG = {
    "jobs": {
        "known": {"operator": "noop", "runtime": "lambda", "timeout_seconds": 30},
        "unknown": {"operator": "missing", "runtime": "lambda", "timeout_seconds": 30},
    }
}
# Decided at collection, so a machine without Docker starts no server for this module.
pytestmark = pytest.mark.skipif(not docker_available(), reason="no Docker engine reachable")
HANDLER = "def handler(event, context):\n    return {'task_id': event['task']['task_id']}\n"


@pytest.fixture(scope="module")
def localstack_lambda_url() -> Iterator[str]:
    module = None
    for name in ("testcontainers.community.localstack", "testcontainers.localstack"):
        try:
            module = importlib.import_module(name)
            break
        except ImportError:
            continue
    if module is None:
        pytest.skip("testcontainers[localstack] is not installed")
    container = module.LocalStackContainer(image=TESTCONTAINERS_LOCALSTACK_IMAGE)
    container.with_volume_mapping("/var/run/docker.sock", "/var/run/docker.sock", "rw")
    with container.with_services("lambda", "iam") as started:
        url: str = started.get_url()
        yield url


@pytest.fixture
def d(db_url: str) -> Iterator[Dispatcher]:
    with serve_dispatcher(db_url, attempt_token_keys=KEYS, attempt_token_active_kid="k1") as d:
        assert d.api.put("/dags/d", json=DAG).status_code == 201
        yield d


def _zip(source: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("fn.py", source)
    return buffer.getvalue()


def _run(d: Dispatcher, job: str) -> str:
    response = d.api.post(f"/dags/d/jobs/{job}/runs", json={})
    assert response.status_code == 201, response.text
    task_id: str = response.json()["task_id"]
    return task_id


def _row(db_url: str, task_id: str) -> dict[str, Any]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT o.sent_at, o.last_error, t.status, t.worker_id FROM outbox AS o "
            "JOIN tasks AS t USING (task_id) WHERE o.task_id = %s AND o.kind = 'invoke_lambda'",
            (task_id,),
        ).fetchone()
    assert row is not None
    return row


def test_invocations_against_localstack_lambda(
    localstack_lambda_url: str, d: Dispatcher, db_url: str, sqs_endpoint_url: str,
    pool: ConnectionPool[Connection[DictRow]],
) -> None:  # fmt: skip
    settings = make_settings(
        db_url, sqs_endpoint_url, lambda_endpoint_url=localstack_lambda_url,
        attempt_token_keys=KEYS, attempt_token_active_kid="k1",
    )  # fmt: skip
    client = lambda_client(settings)
    client.create_function(
        FunctionName="noop",
        Runtime="python3.11",
        Handler="fn.handler",
        Role="arn:aws:iam::000000000000:role/taskplat-noop",
        Code={"ZipFile": _zip(HANDLER)},
        Timeout=30,
    )
    client.get_waiter("function_active_v2").wait(FunctionName="noop")
    client.put_function_event_invoke_config(FunctionName="noop", MaximumRetryAttempts=0)
    config = client.get_function_event_invoke_config(FunctionName="noop")
    assert config["MaximumRetryAttempts"] == 0

    invoker = Invoker(settings, pool=pool, client=client, clock=d.clock, rand=random.Random(1))
    known, unknown = _run(d, "known"), _run(d, "unknown")
    batch = invoker.run_once()
    assert (batch.invoked, batch.failed) == (1, 1)
    accepted = _row(db_url, known)
    assert accepted["sent_at"] is not None
    assert (accepted["status"], accepted["worker_id"]) == ("Running", "lambda:noop")
    refused = _row(db_url, unknown)
    assert refused["sent_at"] is None and refused["status"] == "Queued"
    assert "ResourceNotFoundException" in refused["last_error"]

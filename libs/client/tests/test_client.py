"""The sync and async clients against a real dispatcher: typed answers, typed errors carrying the
server's JSON error, pagination as an iterator, retries of idempotent calls on connection errors,
and the client's models checked against the dispatcher's `/openapi.json`."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import httpx
import pytest

from taskplat.client import (
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    Unauthorized,
    Unreachable,
    ValidationError,
)
from taskplat.client.models import CHECKED
from taskplat.devstack.ports import free_port
from taskplat.testkit.dispatcher_calls import claimed, complete
from taskplat.testkit.dispatcher_harness import API_KEY, Dispatcher


@pytest.fixture
def client(dispatcher: Dispatcher) -> Any:
    with Client(dispatcher.base_url, API_KEY) as client:
        yield client


def _schema_fields(schemas: dict[str, Any], name: str) -> set[str]:
    return set(schemas[name]["properties"])


def test_models_name_the_fields_of_the_servers_schemas(dispatcher: Dispatcher) -> None:
    document = dispatcher.anonymous.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    for model in CHECKED:
        assert model.__name__ in schemas, f"the server has no schema {model.__name__}"
        server = _schema_fields(schemas, model.__name__)
        fields = {field.alias or name: field for name, field in model.model_fields.items()}
        assert set(fields) == server, model.__name__
        required = set(schemas[model.__name__].get("required", []))
        optional_here = {name for name, field in fields.items() if not field.is_required()}
        # A field the client may default must be nullable or defaulted on the server too.
        for name in required & optional_here:
            prop = schemas[model.__name__]["properties"][name]
            assert "null" in str(prop) or name == "detail", (model.__name__, name)


def test_tasks_round_trip_with_typed_answers(client: Client, dispatcher: Dispatcher) -> None:
    task = client.submit("echo", config={"n": 1}, queue="alpha", max_attempts=1)
    assert task.status == "Queued" and task.config == {"n": 1} and task.queue == "alpha"
    assert task.priority == 5 and client.submit("echo", priority=2).priority == 2
    again = client.submit("echo", idempotency_key="k1")
    assert client.submit("echo", idempotency_key="k1").task_id == again.task_id
    assert client.get(task.task_id) == client.get(str(task.task_id))
    lease = claimed(dispatcher, str(task.task_id))
    assert complete(dispatcher, lease, "Failed", error_message="boom").status_code == 200
    dead = client.get(task.task_id)
    assert dead.status == "Dead" and dead.attempts[0].outcome == "Failed" and dead.finished
    assert client.retry(task.task_id).status == "Queued"
    assert client.cancel(task.task_id).status == "Canceled"
    replay = client.retry_many([task.task_id, uuid4()])
    assert replay.replayed == [task.task_id] and replay.skipped[0].reason == "NotFound"
    batch = client.submit_many([{"operator": "echo"}, {"operator": "echo", "queue": "beta"}])
    assert [result.created for result in batch.results] == [True, True]


def test_list_pagination_is_an_iterator(client: Client) -> None:
    created = [client.submit("echo", queue="beta").task_id for _ in range(5)]
    page = client.list_tasks(queue="beta", limit=2)
    assert len(page.tasks) == 2 and page.next_cursor is not None
    listed = [task.task_id for task in client.iter_tasks(queue="beta", limit=2)]
    assert len(listed) == 5 and set(listed) == set(created)  # 3 pages, each task once


def test_errors_are_typed_and_carry_the_servers_json(
    client: Client, dispatcher: Dispatcher
) -> None:
    with pytest.raises(NotFound) as missing:
        client.get(uuid4())
    assert missing.value.status_code == 404 and missing.value.error == "not_found"
    with pytest.raises(ValidationError) as invalid:
        client.get("not-a-uuid")
    assert invalid.value.detail[0]["loc"] == ["path", "task_id"]
    with pytest.raises(ValidationError, match="unknown queue 'nowhere'"):
        client.submit("echo", queue="nowhere")
    done = client.submit("echo")
    assert complete(dispatcher, claimed(dispatcher, str(done.task_id))).status_code == 200
    with pytest.raises(Conflict) as conflict:
        client.cancel(done.task_id)
    assert conflict.value.body["error"] == "conflict"
    with Client(dispatcher.base_url, "wrong-key-0123456789") as stranger:
        with pytest.raises(Unauthorized):
            stranger.queues()
    with Client(f"http://127.0.0.1:{free_port()}", API_KEY, retries=1) as nowhere:
        with pytest.raises(Unreachable, match="cannot reach the dispatcher"):
            nowhere.get(uuid4())


class FlakyTransport(httpx.HTTPTransport):
    """A real HTTP transport whose first `failures` connections are refused."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.requests: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        if self.failures > 0:
            self.failures -= 1
            raise httpx.ReadError("connection reset", request=request)
        return super().handle_request(request)


def test_idempotent_calls_are_retried_and_others_are_not(dispatcher: Dispatcher) -> None:
    flaky = FlakyTransport(failures=2)
    with Client(dispatcher.base_url, API_KEY, transport_=flaky) as client:
        assert client.queues().queues  # a GET: retried twice, then answered
        assert len(flaky.requests) == 3
        flaky.failures = 1
        with pytest.raises(Unreachable):
            client.submit("echo")  # a POST without an idempotency key: sent once
        flaky.failures = 1
        keyed = client.submit("echo", idempotency_key="retry-me")  # keyed: retried
        assert keyed.status == "Queued"
    assert flaky.requests[-2:] == ["POST /tasks", "POST /tasks"]


def test_queues_and_stats(client: Client) -> None:
    client.submit("echo", queue="gamma")
    assert client.pause("gamma").paused
    queues = {queue.name: queue for queue in client.queues().queues}
    assert queues["gamma"].paused and queues["gamma"].depth == 1
    assert not client.resume("gamma").paused
    stats = client.stats()
    assert [(c.queue, c.status, c.tasks) for c in stats.counts] == [("gamma", "Queued", 1)]


def test_the_async_client(dispatcher: Dispatcher) -> None:
    async def scenario() -> None:
        async with AsyncClient(dispatcher.base_url, API_KEY) as client:
            tasks = await asyncio.gather(*(client.submit("echo", queue="q1") for _ in range(3)))
            listed = [task.task_id async for task in client.iter_tasks(queue="q1", limit=1)]
            assert sorted(listed) == sorted(task.task_id for task in tasks)
            assert (await client.get(tasks[0].task_id)).status == "Queued"
            with pytest.raises(NotFound):
                await client.cancel(uuid4())

    asyncio.run(scenario())


def test_dags_datasets_and_events_come_back_typed(client: Client, dispatcher: Dispatcher) -> None:
    doc = {
        "jobs": {
            "source": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"}]},
            "sink": {"operator": "echo", "inputs": [{"from": {"dataset": "blocks"}}]},
        }
    }
    applied = client.apply_dag("typed", doc)
    assert applied.changed is True and [job.name for job in applied.jobs] == ["sink", "source"]
    assert applied.jobs[0].inputs[0].from_ == {"dataset": "blocks"}
    assert client.dags().dags[0].jobs == 2
    assert client.dag("typed").document_hash == applied.document_hash
    blocks = client.datasets().datasets[0]
    assert blocks.name == "blocks"
    dataset = client.dataset(blocks.dataset_uuid)
    assert dataset.versions[0].current and dataset.latest_cursor is None
    assert client.dataset_events(blocks.dataset_uuid).events == []
    run = client.run_job("typed", "source", config={"n": 1}, idempotency_key="r1")
    assert run.job is not None and run.job.name == "source" and run.config == {"n": 1}
    assert client.run_job("typed", "source", idempotency_key="r1").task_id == run.task_id
    assert client.task_events(run.task_id).events == []


def test_a_rollback_and_a_repinning_replay(client: Client, dispatcher: Dispatcher) -> None:
    doc = {
        "jobs": {
            "source": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"}]},
            "sink": {"operator": "echo", "inputs": [{"from": {"dataset": "blocks"}}]},
        }
    }
    client.apply_dag("pinned", doc)
    blocks = client.datasets().datasets[0]
    v1 = blocks.current_version
    task = client.submit(
        "echo", job={"dag_name": "pinned", "name": "sink"},
        inputs=[{"dataset_uuid": str(blocks.dataset_uuid)}],
    )  # fmt: skip
    moved = dispatcher.api.post(f"/datasets/{blocks.dataset_uuid}/versions", json={}).json()
    assert client.get(task.task_id).cancel_reason == "VersionSuperseded"
    with pytest.raises(Conflict) as refused:
        client.retry(task.task_id)
    assert refused.value.status_code == 409 and "PinnedVersionNotCurrent" in str(refused.value)
    replayed = client.retry(task.task_id, repin=True)
    assert replayed.inputs[0]["dataset_version"] == moved["dataset"]["current_version"]

    async def roll_back() -> None:
        async with AsyncClient(dispatcher.base_url, API_KEY) as aio:
            answer = await aio.rollback_dataset(blocks.dataset_uuid, v1)
        assert answer.dataset.current_version == v1 and answer.canceled_tasks == 1

    asyncio.run(roll_back())
    version = client.dataset(blocks.dataset_uuid).versions[0]
    assert (version.dataset_version, version.became_current) == (v1, "rollback")
    again = client.rollback_dataset(blocks.dataset_uuid, v1)
    assert again.canceled_tasks == 0
    assert client.retry_many([task.task_id]).skipped[0].reason == "PinnedVersionNotCurrent"
    assert client.retry_many([task.task_id], repin=True).replayed == [task.task_id]


def test_the_async_client_covers_the_operations_api(dispatcher: Dispatcher) -> None:
    """Every async method added with scoped keys, the audit log and workers answers typed."""
    doc = {
        "jobs": {
            "source": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"}]},
            "sink": {"operator": "echo", "inputs": [{"from": {"dataset": "blocks"}}]},
        }
    }

    async def scenario() -> None:
        async with AsyncClient(dispatcher.base_url, API_KEY) as aio:
            assert (await aio.register_queue("async-q")).name == "async-q"
            assert (await aio.pause("async-q")).paused and not (await aio.resume("async-q")).paused
            assert "async-q" in [queue.name for queue in (await aio.queues()).queues]
            created = await aio.create_key("async-reader", ["read"])
            assert created.key.startswith("tpk_") and created.scopes == ["read"]
            assert "async-reader" in [key.name for key in (await aio.keys()).keys]
            async with AsyncClient(dispatcher.base_url, created.key) as reader:
                assert (await reader.stats()).counts == []
                with pytest.raises(Forbidden, match="'submit' scope"):
                    await reader.submit("echo")
            assert (await aio.revoke_key("async-reader")).revoked is True
            actions = [entry.action for entry in (await aio.audit()).entries]
            assert {"create_key", "revoke_key", "pause_queue"} <= set(actions)
            assert (await aio.workers()).workers == []

            assert (await aio.apply_dag("async-dag", doc)).changed is True
            assert [dag.dag_name for dag in (await aio.dags()).dags] == ["async-dag"]
            assert len((await aio.dag("async-dag")).jobs) == 2
            blocks = (await aio.datasets()).datasets[0]
            newer = await aio.new_dataset_version(blocks.dataset_uuid)
            assert newer.dataset.current_version != blocks.current_version
            assert (await aio.dataset(blocks.dataset_uuid)).name == "blocks"
            assert (await aio.dataset_events(blocks.dataset_uuid)).events == []
            run = await aio.run_job("async-dag", "source", config={"n": 1})
            assert (await aio.task_events(run.task_id)).events == []
            canceled = await aio.cancel(run.task_id)
            assert canceled.status == "Canceled"
            assert (await aio.wait(run.task_id, timeout=5)).status == "Canceled"
            assert (await aio.retry_many([run.task_id])).replayed == [run.task_id]
            assert (await aio.delete_dag("async-dag")).deleted is True

    asyncio.run(scenario())

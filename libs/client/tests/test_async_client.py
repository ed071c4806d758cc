"""The async client's own tests against a real dispatcher: it shares no transport code with the
sync client (its `run` sends, retries and parses on `httpx.AsyncClient`), so the calls the sync
tests cover are covered here too: tasks round trip (submit with an idempotency key, submit_many,
list_tasks pages, retry, retry_many, cancel), typed errors carrying the server's JSON, retries of
idempotent calls only, and `wait` until a task finishes or the timeout passes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from uuid import uuid4

import httpx
import pytest

from taskplat.client import (
    AsyncClient,
    Conflict,
    NotFound,
    TaskplatError,
    Unauthorized,
    Unreachable,
    ValidationError,
)
from taskplat.client.models import TaskView
from taskplat.devstack.ports import free_port
from taskplat.testkit.dispatcher_calls import claimed, complete
from taskplat.testkit.dispatcher_harness import API_KEY, Dispatcher


def _run(dispatcher: Dispatcher, scenario: Callable[[AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        async with AsyncClient(dispatcher.base_url, API_KEY) as client:
            await scenario(client)

    asyncio.run(main())


def test_tasks_round_trip_with_typed_answers(dispatcher: Dispatcher) -> None:
    async def scenario(client: AsyncClient) -> None:
        task = await client.submit("echo", config={"n": 1}, queue="alpha", max_attempts=1)
        assert task.status == "Queued" and task.config == {"n": 1} and task.queue == "alpha"
        again = await client.submit("echo", idempotency_key="k1")
        assert (await client.submit("echo", idempotency_key="k1")).task_id == again.task_id
        assert await client.get(task.task_id) == await client.get(str(task.task_id))
        # The worker side, as a worker would (synchronous: the harness's client).
        lease = await asyncio.to_thread(claimed, dispatcher, str(task.task_id))
        failed = await asyncio.to_thread(
            complete, dispatcher, lease, "Failed", error_message="boom"
        )
        assert failed.status_code == 200
        dead = await client.get(task.task_id)
        assert dead.status == "Dead" and dead.attempts[0].outcome == "Failed" and dead.finished
        assert (await client.retry(task.task_id)).status == "Queued"
        assert (await client.cancel(task.task_id)).status == "Canceled"
        replay = await client.retry_many([task.task_id, uuid4()])
        assert replay.replayed == [task.task_id] and replay.skipped[0].reason == "NotFound"
        batch = await client.submit_many(
            [{"operator": "echo"}, {"operator": "echo", "queue": "beta"}]
        )
        assert [result.created for result in batch.results] == [True, True]
        assert batch.results[1].task.queue == "beta"

    _run(dispatcher, scenario)


def test_list_tasks_pages_and_follows_its_cursor(dispatcher: Dispatcher) -> None:
    async def scenario(client: AsyncClient) -> None:
        created = [(await client.submit("echo", queue="beta")).task_id for _ in range(5)]
        first = await client.list_tasks(queue="beta", limit=2)
        assert len(first.tasks) == 2 and first.next_cursor is not None
        second = await client.list_tasks(queue="beta", limit=2, cursor=first.next_cursor)
        assert len(second.tasks) == 2
        assert not {t.task_id for t in first.tasks} & {t.task_id for t in second.tasks}
        listed = [task.task_id async for task in client.iter_tasks(queue="beta", limit=2)]
        assert len(listed) == 5 and set(listed) == set(created)
        assert (await client.list_tasks(queue="gamma")).tasks == []

    _run(dispatcher, scenario)


def test_errors_are_typed_and_carry_the_servers_json(dispatcher: Dispatcher) -> None:
    async def scenario(client: AsyncClient) -> None:
        with pytest.raises(NotFound) as missing:
            await client.get(uuid4())
        assert missing.value.status_code == 404 and missing.value.error == "not_found"
        with pytest.raises(ValidationError) as invalid:
            await client.get("not-a-uuid")
        assert invalid.value.detail[0]["loc"] == ["path", "task_id"]
        with pytest.raises(ValidationError, match="unknown queue 'nowhere'"):
            await client.submit("echo", queue="nowhere")
        done = await client.submit("echo")
        lease = await asyncio.to_thread(claimed, dispatcher, str(done.task_id))
        assert (await asyncio.to_thread(complete, dispatcher, lease)).status_code == 200
        with pytest.raises(Conflict) as conflict:
            await client.cancel(done.task_id)
        assert conflict.value.body["error"] == "conflict"
        async with AsyncClient(dispatcher.base_url, "wrong-key-0123456789") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.queues()
        nowhere_url = f"http://127.0.0.1:{free_port()}"
        async with AsyncClient(nowhere_url, API_KEY, retries=1) as nowhere:
            with pytest.raises(Unreachable, match="cannot reach the dispatcher"):
                await nowhere.get(uuid4())

    _run(dispatcher, scenario)


class FlakyAsyncTransport(httpx.AsyncHTTPTransport):
    """A real async HTTP transport whose first `failures` requests fail to connect."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.requests: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        if self.failures > 0:
            self.failures -= 1
            raise httpx.ReadError("connection reset", request=request)
        return await super().handle_async_request(request)


def test_idempotent_calls_are_retried_and_others_are_not(dispatcher: Dispatcher) -> None:
    flaky = FlakyAsyncTransport(failures=2)
    keyed: list[TaskView] = []

    async def scenario() -> None:
        async with AsyncClient(dispatcher.base_url, API_KEY, transport_=flaky) as client:
            assert (await client.queues()).queues  # a GET: retried twice, then answered
            assert len(flaky.requests) == 3
            flaky.failures = 1
            with pytest.raises(Unreachable):
                await client.submit("echo")  # a POST without an idempotency key: sent once
            assert len(flaky.requests) == 4
            flaky.failures = 1
            keyed.append(await client.submit("echo", idempotency_key="retry-me"))  # retried
            flaky.failures = 5
            with pytest.raises(Unreachable):
                await client.get(keyed[0].task_id)  # retried `retries` (3) times, then given up

    asyncio.run(scenario())
    assert keyed[0].status == "Queued"
    assert flaky.requests[3:6] == ["POST /tasks"] * 3
    assert flaky.requests[6:] == [f"GET /tasks/{keyed[0].task_id}"] * 4


def test_wait_returns_the_finished_task_or_gives_up_at_its_timeout(
    dispatcher: Dispatcher,
) -> None:
    async def scenario(client: AsyncClient) -> None:
        task = await client.submit("echo")
        with pytest.raises(TaskplatError, match="still Queued"):
            await client.wait(task.task_id, timeout=0)
        lease = await asyncio.to_thread(claimed, dispatcher, str(task.task_id))
        seen: list[TaskView] = []
        waiting = asyncio.ensure_future(
            client.wait(task.task_id, timeout=30, poll_seconds=0.05, on_update=seen.append)
        )
        await asyncio.sleep(0)  # it polls while the task runs
        assert (await asyncio.to_thread(complete, dispatcher, lease)).status_code == 200
        done = await waiting
        assert done.status == "Completed" and done.finished
        assert seen[-1] == done and all(view.task_id == task.task_id for view in seen)

    _run(dispatcher, scenario)

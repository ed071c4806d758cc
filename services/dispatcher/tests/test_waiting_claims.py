"""`task-claim-next` with `wait_seconds`: a claim that finds no task waits for one, is woken by
the create's NOTIFY, and the create holds the task's SQS wake-up back meanwhile (delayed, never
lost)."""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from taskplat.devstack.waiting import wait_for
from taskplat.testkit.dispatcher_calls import create_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import outbox_xmins, task_pins, task_row, task_xmin

JsonDict = dict[str, Any]
DEADLINE = 15.0


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    return {"claim_max_wait_seconds": 30, "polled_wakeup_delay_seconds": 2.0}


def _client(dispatcher: Dispatcher) -> httpx.Client:
    return httpx.Client(base_url=dispatcher.base_url, headers=dispatcher.worker.headers, timeout=60)


def _claim_next(client: httpx.Client, queue: str, *, wait: float, limit: int = 4) -> list[JsonDict]:
    response = client.post(
        "/internal/task-claim-next",
        json={"worker_id": "w-poll", "queue": queue, "max": limit, "wait_seconds": wait},
    )
    assert response.status_code == 200, response.text
    claimed: list[JsonDict] = response.json()["claimed"]
    return claimed


def _waiting(dispatcher: Dispatcher, queue: str) -> float:
    """`taskplat_claims_waiting` of the queue on /metrics (0 when not reported)."""
    text = dispatcher.anonymous.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("taskplat_claims_waiting{") and f'queue="{queue}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _until_listening(dispatcher: Dispatcher, db_url: str) -> None:
    """Wait until the dispatcher listens for creates: only then does a waiting claim stamp its
    queue (queue `c`, which the tests leave alone otherwise)."""

    def stamped() -> bool:
        with _client(dispatcher) as client:
            _claim_next(client, "c", wait=0.05)
        with psycopg.connect(db_url) as conn:
            row = conn.execute("SELECT polled_until FROM queues WHERE name = 'c'").fetchone()
        return row is not None and row[0] is not None

    wait_for(stamped, timeout=DEADLINE, what="the dispatcher to listen on taskplat_queued")


def _wakeups(db_url: str, task_id: str) -> list[tuple[bool, float]]:
    """(held, seconds from created_at to available_at) of the task's enqueue_task rows."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT held, extract(epoch FROM available_at - created_at)::float8 FROM outbox"
            " WHERE task_id = %s AND kind = 'enqueue_task'",
            (task_id,),
        ).fetchall()
    return [(bool(held), float(delay)) for held, delay in rows]


def _claimed_in_its_create(db_url: str, task_id: str) -> bool:
    """Whether the task's last write (its claim) was the transaction that wrote its wake-up (its
    create): read while the held wake-up is untouched (the relay holds it for 2 s)."""
    return outbox_xmins(db_url, task_id) == [task_xmin(db_url, task_id)]


def test_a_waiting_claim_takes_a_task_created_while_it_waits(
    dispatcher: Dispatcher, db_url: str
) -> None:
    _until_listening(dispatcher, db_url)
    with _client(dispatcher) as client, ThreadPoolExecutor(max_workers=1) as pool:
        # 30 s of wait; the test's own deadline is half that, so the answer is the NOTIFY's.
        poll: Future[list[JsonDict]] = pool.submit(_claim_next, client, "mine", wait=30)
        wait_for(lambda: _waiting(dispatcher, "mine") == 1, timeout=DEADLINE, what="a waiter")
        task_id = create_task(dispatcher, queue="mine")["task_id"]
        claimed = poll.result(timeout=DEADLINE)
    assert [each["task"]["task_id"] for each in claimed] == [task_id]
    assert task_row(db_url, task_id)["status"] == "Running"
    # The create held the wake-up back: the relay sends it later only if the task is Queued.
    assert _wakeups(db_url, task_id) == [(True, 2.0)]
    assert _waiting(dispatcher, "mine") == 0


def test_a_create_claims_for_a_waiting_claim_of_its_own_dispatcher_in_its_transaction(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """The dispatcher where the claim waits claims the task for it in the create's own
    transaction (the task's claim and its wake-up are one transaction's writes),
    and the create's held wake-up NOTIFYs no one (a create with no claim waiting still does).
    A create that comes while the claim is still in its first claim wakes it after its commit
    instead (also without a NOTIFY): the test tries up to three times for the first case."""
    _until_listening(dispatcher, db_url)
    in_transaction = []
    with (
        psycopg.connect(db_url, autocommit=True) as listener,
        _client(dispatcher) as client,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        listener.execute("LISTEN taskplat_queued")
        listener.execute("LISTEN taskplat_outbox")
        for _ in range(3):
            poll: Future[list[JsonDict]] = pool.submit(_claim_next, client, "gamma", wait=30)
            wait_for(lambda: _waiting(dispatcher, "gamma") == 1, timeout=DEADLINE, what="a waiter")
            task_id = create_task(dispatcher, queue="gamma")["task_id"]
            claimed = poll.result(timeout=DEADLINE)
            assert [each["task"]["task_id"] for each in claimed] == [task_id]
            assert _wakeups(db_url, task_id) == [(True, 2.0)]  # held: sent only if still Queued
            row = task_row(db_url, task_id)
            assert row is not None and row["status"] == "Running"
            in_transaction.append(_claimed_in_its_create(db_url, task_id))
            if in_transaction[-1]:
                break
        create_task(dispatcher, queue="beta")  # nobody waits: NOTIFYs the relay
        # Notifications come in commit order: once `beta`'s is here, `gamma`'s would have been.
        received: list[tuple[str, str]] = []
        for notify in listener.notifies(timeout=DEADLINE):
            received.append((notify.channel, notify.payload))
            if notify.payload == "beta":
                break
    assert received == [("taskplat_outbox", "beta")]
    assert in_transaction[-1], in_transaction


def test_a_create_that_woke_a_waiting_claim_answers_the_task_as_created(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """The create answers from its own statement's row (no read back): the task as it was
    created, Queued, even when the claim it woke already took it."""
    _until_listening(dispatcher, db_url)
    with _client(dispatcher) as client, ThreadPoolExecutor(max_workers=1) as pool:
        poll: Future[list[JsonDict]] = pool.submit(_claim_next, client, "q3", wait=30)
        wait_for(lambda: _waiting(dispatcher, "q3") == 1, timeout=DEADLINE, what="a waiter")
        created = create_task(dispatcher, queue="q3")
        claimed = poll.result(timeout=DEADLINE)
    assert [each["task"]["task_id"] for each in claimed] == [created["task_id"]]
    assert created["status"] == "Queued" and created["attempts"] == []
    assert created["worker_id"] is None and created["started_at"] is None
    now = dispatcher.api.get(f"/tasks/{created['task_id']}").json()
    assert now["status"] == "Running" and len(now["attempts"]) == 1
    unchanged = set(created) - {"status", "worker_id", "started_at", "attempts"}
    assert {key: created[key] for key in unchanged} == {key: now[key] for key in unchanged}


PIN_DAG: JsonDict = {
    "jobs": {
        "source": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"}]},
        "transform": {"operator": "emit",
                      "inputs": [{"from": {"job": "source", "output_index": 0}}]},
    }
}  # fmt: skip


def test_a_pinned_task_created_while_a_claim_waits_is_claimed_for_it_with_its_pins(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """A task of a job reading a dataset is pinned in the create's transaction; the claim made
    for the waiting claim is a savepoint in that transaction, and the claimed task has its pin.
    Up to three tries, as above, for the waiting claim to be inside its wait."""
    _until_listening(dispatcher, db_url)
    assert dispatcher.api.put("/dags/pinned", json=PIN_DAG).status_code == 201
    blocks = next(
        each for each in dispatcher.api.get("/datasets").json()["datasets"]
        if each["name"] == "blocks"
    )  # fmt: skip
    job = {"dag_name": "pinned", "name": "transform"}
    in_transaction = []
    with _client(dispatcher) as client, ThreadPoolExecutor(max_workers=1) as pool:
        for _ in range(3):
            poll: Future[list[JsonDict]] = pool.submit(_claim_next, client, "ingest", wait=30)
            wait_for(lambda: _waiting(dispatcher, "ingest") == 1, timeout=DEADLINE, what="a waiter")
            task = create_task(
                dispatcher, operator="emit", queue="ingest", job=job,
                inputs=[{"dataset_uuid": blocks["dataset_uuid"]}],
            )  # fmt: skip
            claimed = poll.result(timeout=DEADLINE)
            assert [each["task"]["task_id"] for each in claimed] == [task["task_id"]]
            pinned = task_pins(db_url, task["task_id"])
            assert pinned == [(blocks["dataset_uuid"], blocks["current_version"])]
            in_transaction.append(_claimed_in_its_create(db_url, task["task_id"]))
            if in_transaction[-1]:
                break
    assert in_transaction[-1], in_transaction


def test_a_create_of_a_known_idempotency_key_while_a_claim_waits_answers_the_existing_task(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """The insert of a known key writes nothing: the create answers the existing task (200),
    and the waiting claim, handed nothing that key's task, still answers when its wait ends."""
    _until_listening(dispatcher, db_url)
    key = "known-while-a-claim-waits"
    first = create_task(dispatcher, queue="fast-lane", idempotency_key=key)
    with _client(dispatcher) as client:
        taken = _claim_next(client, "fast-lane", wait=0)
        assert [each["task"]["task_id"] for each in taken] == [first["task_id"]]
        with ThreadPoolExecutor(max_workers=1) as pool:
            poll: Future[list[JsonDict]] = pool.submit(_claim_next, client, "fast-lane", wait=2)
            wait_for(
                lambda: _waiting(dispatcher, "fast-lane") == 1, timeout=DEADLINE, what="a waiter"
            )
            again = dispatcher.api.post(
                "/tasks", json={"operator": "echo", "queue": "fast-lane", "idempotency_key": key}
            )
            assert again.status_code == 200, again.text
            assert again.json()["task_id"] == first["task_id"]
            assert again.json()["status"] == "Running"
            assert poll.result(timeout=DEADLINE) == []
    assert _waiting(dispatcher, "fast-lane") == 0


def test_a_waiting_claim_takes_a_queued_task_at_once_and_answers_none_after_its_wait(
    dispatcher: Dispatcher,
) -> None:
    first = create_task(dispatcher, queue="other")["task_id"]
    with _client(dispatcher) as client:
        assert [c["task"]["task_id"] for c in _claim_next(client, "other", wait=30)] == [first]
        assert _claim_next(client, "other", wait=0.3) == []


def test_creates_hold_wakeups_back_only_while_a_claim_waits_or_lately_waited(
    dispatcher: Dispatcher, db_url: str
) -> None:
    before = create_task(dispatcher, queue="q1")["task_id"]
    assert _wakeups(db_url, before) == [(False, 0.0)]  # nobody waits: due at once
    _until_listening(dispatcher, db_url)
    with _client(dispatcher) as client:
        assert [c["task"]["task_id"] for c in _claim_next(client, "q1", wait=0.3)] == [before]
    # The stamp covers the wait; the dispatcher's clock is the test's (it has not moved).
    during = create_task(dispatcher, queue="q1")["task_id"]
    assert _wakeups(db_url, during) == [(True, 2.0)]
    other_queue = create_task(dispatcher, queue="q2")["task_id"]
    assert _wakeups(db_url, other_queue) == [(False, 0.0)]
    response = dispatcher.api.post(
        "/tasks/batch", json={"tasks": [{"operator": "echo", "queue": "q1"}] * 2}
    )
    assert response.status_code == 201, response.text
    for result in response.json()["results"]:
        assert _wakeups(db_url, result["task"]["task_id"]) == [(True, 2.0)]
    dispatcher.clock.advance(5)  # past the wait: nobody polls any more
    after = create_task(dispatcher, queue="q1")["task_id"]
    assert _wakeups(db_url, after) == [(False, 0.0)]


def test_a_claim_whose_client_went_away_claims_nothing(dispatcher: Dispatcher, db_url: str) -> None:
    _until_listening(dispatcher, db_url)
    body = json.dumps({"worker_id": "w-gone", "queue": "q3", "max": 1, "wait_seconds": 30})
    host, port = dispatcher.base_url.removeprefix("http://").split(":")
    request = (
        f"POST /internal/task-claim-next HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {dispatcher.worker.headers['Authorization']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request.encode())
        wait_for(lambda: _waiting(dispatcher, "q3") == 1, timeout=DEADLINE, what="a waiter")
    # The connection closed under the waiting call: it ends, and claims nothing more.
    wait_for(lambda: _waiting(dispatcher, "q3") == 0, timeout=DEADLINE, what="the waiter gone")
    task_id = create_task(dispatcher, queue="q3")["task_id"]
    assert task_row(db_url, task_id)["status"] == "Queued"


def _claim_next_calls(dispatcher: Dispatcher) -> float:
    """Finished `task-claim-next` calls, whatever their answer (the HTTP duration count)."""
    text = dispatcher.anonymous.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("taskplat_http_server_duration_seconds_count{")
        and 'route="/internal/task-claim-next"' in line
    )


def test_a_claim_whose_client_left_before_its_answer_leaves_no_task_to_it(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task_id = create_task(dispatcher, queue="q2")["task_id"]  # Queued: a claim takes it at once
    body = json.dumps({"worker_id": "w-left", "queue": "q2", "max": 1, "wait_seconds": 30})
    host, port = dispatcher.base_url.removeprefix("http://").split(":")
    request = (
        f"POST /internal/task-claim-next HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {dispatcher.worker.headers['Authorization']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    )
    calls = _claim_next_calls(dispatcher)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request.encode())  # and the connection closes at once: the client left
    wait_for(
        lambda: _claim_next_calls(dispatcher) > calls, timeout=DEADLINE, what="the call to end"
    )
    # Whether its claim began after the client left (it claims nothing) or just before (what it
    # claimed is handed back, Drained), no attempt is left to the client that cannot hear of it.
    row = task_row(db_url, task_id)
    assert row["status"] in ("Queued", "Failed"), row
    with psycopg.connect(db_url) as conn:
        open_attempts = conn.execute(
            "SELECT count(*) FROM task_attempts WHERE task_id = %s AND finished_at IS NULL",
            (task_id,),
        ).fetchone()
    assert open_attempts == (0,)


def test_concurrent_waiting_claims_each_take_a_task_once(
    dispatcher: Dispatcher, db_url: str
) -> None:
    waiters, tasks = 3, 6
    _until_listening(dispatcher, db_url)
    clients = [_client(dispatcher) for _ in range(waiters)]
    claimed: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def drain(client: httpx.Client) -> None:
        while not done.is_set():
            answer = _claim_next(client, "q", wait=0.5, limit=2)
            with lock:
                claimed.extend(each["task"]["task_id"] for each in answer)
                if len(claimed) >= tasks:
                    done.set()

    try:
        with ThreadPoolExecutor(max_workers=waiters) as pool:
            running = [pool.submit(drain, client) for client in clients]
            wait_for(lambda: _waiting(dispatcher, "q") >= 1, timeout=DEADLINE, what="waiters")
            created = [create_task(dispatcher, queue="q")["task_id"] for _ in range(tasks)]
            wait_for(done.is_set, timeout=DEADLINE, what="every task claimed")
            for each in running:
                each.result(timeout=DEADLINE)
    finally:
        done.set()
        for client in clients:
            client.close()
    assert sorted(claimed) == sorted(created), "each task claimed once"


def test_a_waiting_claim_takes_a_replayed_task(dispatcher: Dispatcher, db_url: str) -> None:
    """Every transition into Queued wakes a waiting claim, not only a create: here a replay,
    which NOTIFYs the relay's channel (its wake-up is sent too, then answered NotClaimed)."""
    task_id = create_task(dispatcher, queue="alpha")["task_id"]
    assert dispatcher.api.put(f"/tasks/{task_id}/cancel").status_code == 200
    _until_listening(dispatcher, db_url)
    with _client(dispatcher) as client, ThreadPoolExecutor(max_workers=1) as pool:
        poll: Future[list[JsonDict]] = pool.submit(_claim_next, client, "alpha", wait=30)
        wait_for(lambda: _waiting(dispatcher, "alpha") == 1, timeout=DEADLINE, what="a waiter")
        assert dispatcher.api.post(f"/tasks/{task_id}/retry").status_code == 200
        claimed = poll.result(timeout=DEADLINE)
    assert [each["task"]["task_id"] for each in claimed] == [task_id]


def test_claim_next_never_takes_a_task_of_a_lambda_job(dispatcher: Dispatcher) -> None:
    """Its function's: the relay claims it for the function (a worker would run it instead)."""
    dag = {"jobs": {"fn": {"operator": "probe", "runtime": "lambda", "timeout_seconds": 60}}}
    assert dispatcher.api.put("/dags/lambdas", json=dag).status_code == 201
    run = dispatcher.api.post("/dags/lambdas/jobs/fn/runs", json={})
    assert run.status_code == 201, run.text
    plain = create_task(dispatcher)["task_id"]  # queued after it, in the same queue
    with _client(dispatcher) as client:
        claimed = _claim_next(client, run.json()["queue"], wait=0.2, limit=10)
    assert [each["task"]["task_id"] for each in claimed] == [plain]

from __future__ import annotations

from taskplat.testkit.dispatcher_harness import Dispatcher


def test_create_and_get(dispatcher: Dispatcher) -> None:
    created = dispatcher.api.post("/tasks", json={"operator": "echo"})
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    got = dispatcher.api.get(f"/tasks/{task_id}")
    assert got.json()["status"] == "Queued"

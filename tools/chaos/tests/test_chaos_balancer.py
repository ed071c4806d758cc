"""The chaos run's dispatcher balancer against real local HTTP servers: requests go round robin,
bodies and headers pass through, a replica that refuses connections is skipped, no reachable
replica is a 502, and claim answers are recorded by route (SQS wake-up, waiting claim, ahead)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from taskplat.chaos.balancer import DispatcherBalancer
from taskplat.devstack.ports import free_port


def _claimed(task_id: str, attempt: int) -> dict[str, Any]:
    return {"status": "Claimed", "attempt": attempt, "task": {"task_id": task_id}}


class _Replica(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/internal/task-claim":
            answer: dict[str, Any] = _claimed(body["task_id"], 1)
        elif self.path == "/internal/task-claim-batch":
            answer = {
                "claimed": [_claimed(body["task_ids"][0], 1)],
                "not_claimed": [
                    {"task_id": t, "reason": "AlreadyRunning"} for t in body["task_ids"][1:]
                ],
            }
        elif self.path == "/internal/task-claim-next":
            answer = {"claimed": [_claimed(body["queue"], 2)]}
        elif self.path == "/internal/task-complete-batch":
            answer = {"results": []}
            if body.get("claim_next") is not None:
                answer["claimed"] = [_claimed(body["claim_next"]["queue"], 3)]
        else:
            answer = {"replica": self.server.server_address[1], "echo": body}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Replica", str(self.server.server_address[1]))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def replicas() -> Iterator[list[str]]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Replica) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_requests_go_round_robin_and_pass_through(replicas: list[str]) -> None:
    with DispatcherBalancer(replicas) as balancer, httpx.Client(base_url=balancer.url) as client:
        answers = [client.post("/tasks", json={"n": n}) for n in range(4)]
        counts = balancer.counts
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.json()["echo"] for a in answers] == [{"n": n} for n in range(4)]
    ports = [a.headers["X-Replica"] for a in answers]
    assert ports[0] != ports[1] and ports[0] == ports[2] and ports[1] == ports[3]
    assert all(counts[f"upstream:{url}"] == 2 for url in replicas)


def test_a_dead_replica_is_skipped_and_none_reachable_is_a_502(replicas: list[str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        DispatcherBalancer([dead, replicas[0]]) as balancer,
        httpx.Client(base_url=balancer.url) as client,
    ):
        assert all(client.post("/x", json={}).status_code == 200 for _ in range(4))
        assert balancer.counts["skipped"] == 2
        balancer.set_upstreams([dead])
        answer = client.post("/x", json={})
        assert answer.status_code == 502
        assert "no dispatcher replica" in answer.text


def test_claims_are_recorded_by_how_they_were_made(replicas: list[str]) -> None:
    with DispatcherBalancer(replicas) as balancer, httpx.Client(base_url=balancer.url) as client:
        client.post("/internal/task-claim", json={"task_id": "a", "worker_id": "w"})
        client.post("/internal/task-claim-batch", json={"task_ids": ["b", "c"], "worker_id": "w"})
        client.post("/internal/task-claim-next", json={"queue": "d", "max": 1, "wait_seconds": 5})
        client.post("/internal/task-claim-next", json={"queue": "e", "max": 1})
        client.post("/internal/task-complete-batch", json={"completions": []})
        client.post(
            "/internal/task-complete-batch",
            json={"completions": [], "claim_next": {"queue": "f", "max": 1}},
        )
        claims = balancer.claims
    assert claims == {
        ("a", 1): "sqs",
        ("b", 1): "sqs",
        ("d", 2): "waiting_claim",
        ("e", 2): "claim_ahead",
        ("f", 3): "claim_ahead",  # along with completions
    }
    assert "unparsed_claim_answers" not in balancer.counts

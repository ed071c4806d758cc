"""The wrapper's scale-in protection calls, against a local HTTP server standing in for the ECS
agent's task-protection endpoint (the documented request shape; no AWS involved): protected while
attempts run, renewed while busy, released when idle, one call per change, retried on failure.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from taskplat.worker_wrapper.observability import WrapperTelemetry
from taskplat.worker_wrapper.task_protection import TaskProtection

DEADLINE_SECONDS = 5.0


class Agent:
    """Records each PUT body; answers `refuse` times with a failure first."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.refuse = 0
        self.lock = threading.Lock()

    def enabled(self) -> list[bool]:
        with self.lock:
            return [bool(body["ProtectionEnabled"]) for body in self.bodies]


@pytest.fixture
def agent() -> Iterator[tuple[Agent, str]]:
    state = Agent()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                refused = state.refuse > 0
                state.refuse -= 1 if refused else 0
                if not refused:
                    state.bodies.append(body)
                    state.paths.append(self.path)
            answer = {"failure": {"Reason": "TASK_NOT_VALID"}} if refused else {"protection": {}}
            payload = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/api/task-1"
    finally:
        server.shutdown()
        server.server_close()


async def _eventually(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_SECONDS
    while not check():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _run(scenario: Callable[[TaskProtection], Awaitable[None]], protection: TaskProtection) -> None:
    async def main() -> None:
        running = asyncio.create_task(protection.run())
        try:
            await scenario(protection)
        finally:
            protection.close()
            await asyncio.wait_for(running, DEADLINE_SECONDS)

    asyncio.run(main())


def test_only_on_ecs() -> None:
    assert TaskProtection.from_environ({}) is None
    assert TaskProtection.from_environ({"ECS_AGENT_URI": "http://169.254.170.2/api/x"})


def test_protected_while_busy_released_when_idle(agent: tuple[Agent, str]) -> None:
    state, uri = agent
    telemetry = WrapperTelemetry()

    async def scenario(protection: TaskProtection) -> None:
        telemetry.watch_busy(protection.busy_changed)
        telemetry.busy(1)
        await _eventually(lambda: state.enabled() == [True], "protection on")
        telemetry.busy(1)  # a second attempt: already protected, no call
        telemetry.busy(-1)
        telemetry.busy(-1)
        await _eventually(lambda: state.enabled() == [True, False], "protection off")

    _run(scenario, TaskProtection(uri, expires_minutes=30))
    assert state.paths == ["/api/task-1/task-protection/v1/state"] * 2
    assert state.bodies == [
        {"ProtectionEnabled": True, "ExpiresInMinutes": 30},
        {"ProtectionEnabled": False},
    ]


def test_renewed_while_busy(agent: tuple[Agent, str]) -> None:
    state, uri = agent

    async def scenario(protection: TaskProtection) -> None:
        protection.busy_changed(1)
        await _eventually(lambda: state.enabled()[:3] == [True] * 3, "two renewals")

    _run(scenario, TaskProtection(uri, renew_seconds=0.05))


def test_a_refused_call_is_retried(agent: tuple[Agent, str]) -> None:
    state, uri = agent
    state.refuse = 2

    async def scenario(protection: TaskProtection) -> None:
        protection.busy_changed(1)
        await _eventually(lambda: state.enabled() == [True], "protection after two refusals")

    _run(scenario, TaskProtection(uri, retry_seconds=0.01))
    assert state.refuse == 0


def test_an_unreachable_agent_never_raises() -> None:
    async def scenario(protection: TaskProtection) -> None:
        protection.busy_changed(1)
        await asyncio.sleep(0)  # the first call is under way when close() ends the loop

    _run(scenario, TaskProtection("http://127.0.0.1:9/api/x", retry_seconds=0.01))

"""The chaos run's task submission: batches of `POST /tasks/batch` spread over a window.

Invariants: HTTP only (processes are started and killed from the run's own thread); a batch is
retried while the dispatchers are away (transport errors, 5xx), each with an idempotency key, so
a retried batch never creates a task twice; any other answer ends the submission with its error.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.waiting import wait_for

BATCH = 100


class Submitter(threading.Thread):
    """Creates the run's tasks in batches spread over `spread` seconds (HTTP only)."""

    def __init__(
        self, url: str, api_key: str, bodies: list[dict[str, Any]], spread: float, run: str
    ) -> None:
        super().__init__(name="chaos-submitter", daemon=True)
        self.url = url
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.bodies = bodies
        self.spread = spread
        self.run_key = run
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._submit()
        except BaseException as exc:
            self.error = exc
        self.finished_at = time.monotonic()

    def _submit(self) -> None:
        batches = [self.bodies[i : i + BATCH] for i in range(0, len(self.bodies), BATCH)]
        started = time.monotonic()
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=10.0) as client:
            for number, batch in enumerate(batches):
                due = started + self.spread * number / len(batches)
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                self._post(client, batch)

    def _post(self, client: httpx.Client, batch: list[dict[str, Any]]) -> None:
        def attempt() -> bool:
            try:
                response = client.post("/tasks/batch", json={"tasks": batch})
            except httpx.TransportError:
                return False
            if response.status_code >= 500:
                return False
            if response.status_code not in (200, 201):
                raise DevstackError(f"POST /tasks/batch: {response.status_code} {response.text}")
            return True

        wait_for(attempt, timeout=120, what="POST /tasks/batch to succeed", interval=0.2)

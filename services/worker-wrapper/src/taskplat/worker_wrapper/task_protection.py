"""ECS task scale-in protection while the wrapper runs attempts.

A pool scaling in stops tasks ECS picks; a busy wrapper then drains and its unfinished attempts
are retried elsewhere. Protecting the task while it runs attempts makes ECS pick idle ones.

Invariants:
  * Only on ECS: `from_environ` returns None unless the agent set `ECS_AGENT_URI`.
  * Protection is wanted exactly while at least one attempt runs (`busy_changed(running)`); the
    first attempt asks for it, the last one to end releases it, and while busy it is renewed every
    `renew_seconds` (well before `expires_minutes`), so long attempts stay protected.
  * One coroutine (`run`) makes the calls, one at a time; the latest wanted state wins, so a burst
    of attempts costs one call. A failed call is logged and retried after `retry_seconds`, never
    raised: a missed protection only costs a drained attempt's retry.
  * The call is the agent's documented `PUT $ECS_AGENT_URI/task-protection/v1/state`; the task
    role must allow `ecs:UpdateTaskProtection` (worker-pool.yaml grants it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp

from taskplat.common.logging import get_logger


class TaskProtection:
    def __init__(
        self,
        agent_uri: str,
        *,
        expires_minutes: int = 60,
        renew_seconds: float = 900.0,
        retry_seconds: float = 10.0,
    ) -> None:
        self._url = agent_uri.rstrip("/") + "/task-protection/v1/state"
        self._expires_minutes = expires_minutes
        self._renew_seconds = renew_seconds
        self._retry_seconds = retry_seconds
        self._wanted = False
        self._closed = False
        self._changed = asyncio.Event()
        self._log = get_logger()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TaskProtection | None:
        agent_uri = environ.get("ECS_AGENT_URI")
        return cls(agent_uri) if agent_uri else None

    def busy_changed(self, running: int) -> None:
        """Called (in the event loop) whenever the number of running attempts changes."""
        wanted = running > 0
        if wanted != self._wanted:
            self._wanted = wanted
            self._changed.set()

    def close(self) -> None:
        self._closed = True
        self._changed.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        applied = False  # a new task is unprotected
        applied_at = loop.time()
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._closed:
                wanted = self._wanted
                renew_due = wanted and loop.time() - applied_at >= self._renew_seconds
                if wanted != applied or renew_due:
                    if await self._put(session, wanted):
                        applied, applied_at = wanted, loop.time()
                    else:
                        await self._wait(self._retry_seconds)
                    continue
                self._changed.clear()
                if self._wanted != applied or self._closed:
                    continue
                await self._wait(
                    self._renew_seconds - (loop.time() - applied_at) if applied else None
                )

    async def _wait(self, seconds: float | None) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), seconds)
        except TimeoutError:
            pass

    async def _put(self, session: aiohttp.ClientSession, enabled: bool) -> bool:
        body: dict[str, Any] = {"ProtectionEnabled": enabled}
        if enabled:
            body["ExpiresInMinutes"] = self._expires_minutes
        try:
            async with session.put(self._url, json=body) as response:
                answer = await response.json(content_type=None)
                ok = response.status == 200 and not (
                    isinstance(answer, dict) and ({"failure", "error"} & set(answer))
                )
                if not ok:
                    self._log.warning(
                        "task_protection_refused", enabled=enabled, status=response.status
                    )
                return ok
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._log.warning("task_protection_failed", enabled=enabled, error=repr(exc))
            return False

"""The benchmark's load generator: a minimal HTTP/1.1 client on asyncio streams.

Why not httpx: on a 2-core machine every CPU cycle the client spends is taken from the system
it measures; a keep-alive connection that writes a prepared request and reads a Content-Length
(or chunked) answer costs a fraction of a general-purpose client per request.

Invariants:
- One `Connection` carries one request at a time (HTTP/1.1 keep-alive, no pipelining); it
  reconnects when the server closed it or asked to (`Connection: close`).
- A request that fails at the transport level raises `BenchError`; nothing is retried, because
  tasks are created without idempotency keys (a retry could create a task twice): a failed
  submission fails the benchmark run instead of distorting it.
- `submit_tasks` keeps at most `in_flight` requests open and records, per task, the client's
  `time.time()` just before its request was written. Setting `stop` ends a submission early
  (no new request starts), so Ctrl-C does not wait for the rest.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from taskplat.devstack.errors import DevstackError


class BenchError(DevstackError):
    """A benchmark run cannot go on (its figures would be wrong)."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One keep-alive HTTP/1.1 connection to `base_url`."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise BenchError(f"the bench client speaks plain http only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        fixed = {"Host": f"{self.host}:{self.port}", **headers}
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        self._reader = self._writer = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        try:
            return await self._request(method, path, body)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            await self.close()
            raise BenchError(f"{method} {path} failed: {type(exc).__name__}: {exc}") from exc

    async def _request(self, method: str, path: str, body: bytes | None) -> Response:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        head = f"{method} {path} HTTP/1.1\r\n{self._head}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ValueError("the server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[bytes, bytes] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            data = await reader.readexactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            data = await _read_chunked(reader)
        else:
            data = await reader.read()
            await self.close()
        if headers.get(b"connection", b"").lower() == b"close":
            await self.close()
        return Response(status, data)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


@dataclass(frozen=True)
class Submitted:
    """Tasks created by one submission: ids in order, the client's time before each request."""

    task_ids: list[str]
    sent_at: list[float]
    first_sent: float
    last_answered: float


def _task_ids(response: Response, expected: int, *, batch: bool) -> list[str]:
    """Task ids of a 200/201 answer: a task view (`POST /tasks`), or for a bulk create
    `{"results": [{"created": .., "task": {..}}, ..]}` (a plain list or `{"tasks": [..]}` too)."""
    if response.status not in (200, 201):
        raise BenchError(f"the dispatcher answered {response.status}: {response.body[:300]!r}")
    doc = response.json()
    items: Any = [doc]
    if batch:
        items = doc
        if isinstance(doc, dict):
            items = doc.get("results", doc.get("tasks"))
        if isinstance(items, list):
            items = [item.get("task", item) if isinstance(item, dict) else item for item in items]
    if not isinstance(items, list) or len(items) != expected:
        raise BenchError(f"expected {expected} task(s) in the answer, got {response.body[:300]!r}")
    return [str(item["task_id"]) for item in items]


async def submit_tasks(
    base_url: str,
    headers: Mapping[str, str],
    bodies: Sequence[Mapping[str, Any]],
    *,
    in_flight: int,
    batch_path: str | None = None,
    batch_size: int = 100,
    on_done: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> Submitted:
    """Create every task of `bodies`, `in_flight` requests at a time: one `POST /tasks` each,
    or `POST <batch_path>` with `{"tasks": [...]}` of up to `batch_size` when given."""
    size = batch_size if batch_path else 1
    groups = [list(range(i, min(i + size, len(bodies)))) for i in range(0, len(bodies), size)]
    encoded = [
        json.dumps(
            {"tasks": [bodies[i] for i in group]} if batch_path else bodies[group[0]]
        ).encode()
        for group in groups
    ]
    ids: list[str] = [""] * len(bodies)
    sent_at = [0.0] * len(bodies)
    path = batch_path or "/tasks"
    next_group = 0

    async def worker() -> None:
        nonlocal next_group
        conn = Connection(base_url, headers)
        try:
            while next_group < len(groups) and not (stop is not None and stop.is_set()):
                index = next_group
                next_group += 1
                group = groups[index]
                t0 = time.time()
                response = await conn.request("POST", path, encoded[index])
                for i, task_id in zip(
                    group, _task_ids(response, len(group), batch=bool(batch_path)), strict=True
                ):
                    ids[i] = task_id
                    sent_at[i] = t0
                if on_done is not None:
                    on_done(len(group))
        finally:
            await conn.close()

    first = time.time()
    workers = [asyncio.create_task(worker()) for _ in range(min(in_flight, len(groups)) or 1)]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
    return Submitted(ids, sent_at, first, time.time())


async def submit_paced(
    base_url: str,
    headers: Mapping[str, str],
    bodies: Sequence[Mapping[str, Any]],
    *,
    rate: float,
    on_done: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> Submitted:
    """Create the tasks one by one on one connection, the i-th at `start + i / rate`, each
    right after the previous answer when the schedule has fallen behind."""
    conn = Connection(base_url, headers)
    ids: list[str] = []
    sent_at: list[float] = []
    encoded = [json.dumps(body).encode() for body in bodies]
    await conn.request("GET", "/healthz")  # connect before the clock starts
    start = time.monotonic()
    first = time.time()
    try:
        for i, body in enumerate(encoded):
            if stop is not None and stop.is_set():
                break
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            t0 = time.time()
            response = await conn.request("POST", "/tasks", body)
            ids.extend(_task_ids(response, 1, batch=False))
            sent_at.append(t0)
            if on_done is not None:
                on_done(1)
    finally:
        await conn.close()
    return Submitted(ids, sent_at, first, time.time())

"""A round-robin HTTP load balancer in front of the dispatcher replicas (`make chaos`).

The worker wrappers and the task submitter talk to the dispatchers through it, as they would
through a load balancer in production. Each *request* goes to the next replica in turn (not each
connection: the wrappers keep their connections open, so balancing connections would pin a
wrapper to one replica until it dies). So a task created on one replica is claimed, heartbeated
and completed on others, and a waiting claim held by one replica is woken by a create on another.

It also records, from the answers it forwards, how each attempt was claimed:
- `sqs`: `POST /internal/task-claim` or `task-claim-batch`, the claims of wake-ups a wrapper
  received from SQS;
- `waiting_claim`: `POST /internal/task-claim-next` with `wait_seconds > 0` (a wrapper's waiting
  claim);
- `claim_ahead`: `POST /internal/task-claim-next` without a wait, or the `claimed` of a
  `POST /internal/task-complete-batch` that carried a `claim_next` (a wrapper claiming ahead
  under a backlog, alone or along with its completions).
Only a wrapper that got the claim answer can complete the attempt, and every answer passes
through here, so every completed attempt's source is known.

Invariants:
- The balancer runs its own event loop in one daemon thread; its methods are thread-safe.
- A request whose connection to a replica could not be opened (the replica is dead or
  restarting) is sent to the next replica: nothing reached the first one. Any other failure after
  the request was sent (the replica died while answering) is answered `502` and never resent, as
  a real load balancer does; the client retries as it would there.
- Request and answer bodies, status and end-to-end headers pass through unchanged (no
  decompression, no redirects followed); hop-by-hop headers are dropped.
- `claims` and `counts` are exact: guarded by a lock, recorded before the answer is returned.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

from taskplat.devstack.errors import DevstackError

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_CLAIM_ROUTES = {
    "/internal/task-claim": "sqs",
    "/internal/task-claim-batch": "sqs",
    "/internal/task-claim-next": "claim_next",
    "/internal/task-complete-batch": "claim_ahead",  # its `claimed`, when it carried a claim_next
}
_COMPLETE_BATCH = "/internal/task-complete-batch"
_UPSTREAM_TIMEOUT_SECONDS = 90.0  # above the longest waiting claim
ClaimSource = str  # "sqs", "waiting_claim" or "claim_ahead"


class DispatcherBalancer:
    """`start()` returns the balancer's URL; `set_upstreams()` names the replicas; `stop()`."""

    def __init__(self, upstreams: list[str] | None = None, *, host: str = "127.0.0.1") -> None:
        self._host = host
        self._upstreams: list[str] = list(upstreams or [])
        self._next = 0
        self._lock = threading.Lock()
        self._claims: dict[tuple[str, int], ClaimSource] = {}
        self._counts: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._url: str | None = None

    # -- control (any thread) ---------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._url is None:
            raise DevstackError("the dispatcher balancer is not running")
        return self._url

    def set_upstreams(self, upstreams: list[str]) -> None:
        with self._lock:
            self._upstreams = list(upstreams)

    def start(self) -> str:
        if self._thread is not None:
            return self.url
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="dispatcher-balancer", daemon=True
        )
        self._thread.start()
        self._url = asyncio.run_coroutine_threadsafe(self._open(), loop).result(timeout=30)
        return self._url

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = None
        self._url = None

    def __enter__(self) -> DispatcherBalancer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def claims(self) -> dict[tuple[str, int], ClaimSource]:
        """How each (task_id, attempt) whose claim answer was forwarded was claimed."""
        with self._lock:
            return dict(self._claims)

    @property
    def counts(self) -> dict[str, int]:
        """Requests per replica (`upstream:<url>`), claims per source (`claimed:<source>`),
        replicas skipped because they refused the connection (`skipped`) and `502`s answered
        (`bad_gateway`)."""
        with self._lock:
            return dict(self._counts)

    # -- the loop's side --------------------------------------------------------------------

    async def _open(self) -> str:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=_UPSTREAM_TIMEOUT_SECONDS, connect=2.0),
            connector=aiohttp.TCPConnector(limit=0),
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, 0)
        await site.start()
        self._runner = runner
        port = runner.addresses[0][1]
        return f"http://{self._host}:{port}"

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _pick(self) -> list[str]:
        """The replicas in the order to try them: the next one in turn first."""
        with self._lock:
            upstreams = list(self._upstreams)
            start = self._next
            self._next = (self._next + 1) % max(len(upstreams), 1)
        return upstreams[start:] + upstreams[:start]

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        assert self._session is not None
        for upstream in self._pick():
            try:
                async with self._session.request(
                    request.method,
                    upstream + request.path_qs,
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                ) as answer:
                    data = await answer.read()
                    status = answer.status
                    reply_headers = [
                        (k, v) for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP
                    ]
            except aiohttp.ClientConnectorError:
                self._count("skipped")
                continue
            except (aiohttp.ClientError, TimeoutError):
                self._count("bad_gateway")
                return web.Response(status=502, text="dispatcher replica failed while answering")
            self._count(f"upstream:{upstream}")
            if status == 200 and request.path in _CLAIM_ROUTES:
                self._record_claims(request.path, body, data)
            response = web.Response(status=status, body=data)
            for name, value in reply_headers:
                response.headers.add(name, value)
            return response
        self._count("bad_gateway")
        return web.Response(status=502, text="no dispatcher replica is reachable")

    def _record_claims(self, path: str, request_body: bytes, answer_body: bytes) -> None:
        source = _CLAIM_ROUTES[path]
        try:
            answer: Any = json.loads(answer_body)
            if source == "claim_next":
                wait = float((json.loads(request_body) or {}).get("wait_seconds") or 0)
                source = "waiting_claim" if wait > 0 else "claim_ahead"
            if path == _COMPLETE_BATCH and "claimed" not in answer:
                return  # completions alone: nothing claimed
            claimed = answer.get("claimed") if "claimed" in answer else [answer]
            pairs = [
                (str(item["task"]["task_id"]), int(item["attempt"]))
                for item in claimed
                if item.get("status", "Claimed") == "Claimed"
            ]
        except (ValueError, TypeError, KeyError, AttributeError):
            self._count("unparsed_claim_answers")
            return
        with self._lock:
            for pair in pairs:
                self._claims[pair] = source
                self._counts[f"claimed:{source}"] += 1

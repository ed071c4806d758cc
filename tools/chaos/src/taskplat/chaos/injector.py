"""A fault-injecting HTTP proxy in front of an SQS endpoint (`make chaos`).

Every service talks to SQS through it. It understands the SQS JSON protocol botocore speaks
(`X-Amz-Target: AmazonSQS.<Action>`, a JSON body) well enough to inject four faults:

- `lose`: a `SendMessage`, or one entry of a `SendMessageBatch`, is answered as sent (a made-up
  message id and the body's MD5) but never reaches the queue;
- `duplicate`: a `SendMessage` or a batch entry is sent twice (the second answer is dropped);
- `fail_receive`: a `ReceiveMessage` is answered with an error before it reaches the queue;
- `fail_delete`: a `DeleteMessage` or a whole `DeleteMessageBatch` is answered with an error
  before it reaches the queue.

An error is, at random, `500 InternalError` or `400 ThrottlingException` (both retried by
botocore's standard retry mode, so an operation fails for the caller only when every retry drew a
fault).

Invariants:
- Decisions come from one `random.Random(seed)`: the same sequence of requests gets the same
  faults. A rate of 0 draws nothing for that kind; each `SendMessage` or batch entry draws once
  (lose below `lose`, duplicate below `lose + duplicate`), each receive or delete once.
- With every rate 0 (`FaultRates()`, the state after `set_rates(FaultRates())`), and for every
  other request, the proxy is transparent: the request's method, path, headers and body reach the
  upstream unchanged, and the upstream's status, headers and body come back unchanged (a chunked
  answer comes back whole, with its Content-Length).
- A batch entry is lost or duplicated only when the rest of the batch was accepted (HTTP 200);
  otherwise the upstream's answer is returned as is and nothing is counted.
- `counts` says how many faults of each kind were injected, how many requests of each action
  were seen and how many messages the receives delivered (`received`); it is exact (guarded by
  a lock).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import random
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

TARGET_PREFIX = "AmazonSQS."
_UPSTREAM_TIMEOUT_SECONDS = 60.0  # above any long-poll wait (SQS allows 20 s)
_JSON_TYPE = "application/x-amz-json-1.0"


@dataclass(frozen=True)
class FaultRates:
    """Shares (0-1) of each fault; see the module doc."""

    lose: float = 0.0
    duplicate: float = 0.0
    fail_receive: float = 0.0
    fail_delete: float = 0.0

    def __post_init__(self) -> None:
        for name in ("lose", "duplicate", "fail_receive", "fail_delete"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault rate {name}={value} is not between 0 and 1")
        if self.lose + self.duplicate > 1.0:
            raise ValueError("lose + duplicate must not exceed 1")

    @property
    def any(self) -> bool:
        return any((self.lose, self.duplicate, self.fail_receive, self.fail_delete))


@dataclass(frozen=True)
class _Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


class SqsFaultInjector:
    """The proxy: `start()` returns its URL; `stop()` ends it. Thread-safe."""

    def __init__(
        self,
        upstream_url: str,
        rates: FaultRates | None = None,
        *,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the upstream must be an http:// URL, not {upstream_url!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self._rates = rates or FaultRates()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._local = threading.local()  # each client connection's upstream connection
        self._upstream_conns: set[http.client.HTTPConnection] = set()
        self._server = _Server((host, port), _handler_class(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- control ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> str:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, name="sqs-fault-injector", daemon=True
            )
            self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()
        with self._lock:
            conns, self._upstream_conns = list(self._upstream_conns), set()
        for conn in conns:
            conn.close()

    def __enter__(self) -> SqsFaultInjector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def rates(self) -> FaultRates:
        with self._lock:
            return self._rates

    def set_rates(self, rates: FaultRates) -> None:
        """Change the fault rates from now on (`FaultRates()`: no more faults)."""
        with self._lock:
            self._rates = rates

    @property
    def counts(self) -> dict[str, int]:
        """Faults injected (`lost`, `duplicated`, `failed_receives`, `failed_deletes`),
        requests seen per action (`action:<Name>`) and messages delivered by receives
        (`received`)."""
        with self._lock:
            return dict(self._counts)

    # -- decisions --------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _draw_send(self) -> str:
        """`lose`, `duplicate` or `pass` for one message."""
        with self._lock:
            rates = self._rates
            if not (rates.lose or rates.duplicate):
                return "pass"
            draw = self._rng.random()
        if draw < rates.lose:
            return "lose"
        if draw < rates.lose + rates.duplicate:
            return "duplicate"
        return "pass"

    def _draw_failure(self, rate_name: str) -> str | None:
        """None, or the error kind (`internal` or `throttling`) to answer with."""
        with self._lock:
            rate: float = getattr(self._rates, rate_name)
            if not rate:
                return None
            failed = self._rng.random() < rate
            kind = "internal" if self._rng.random() < 0.5 else "throttling"
        return kind if failed else None

    # -- forwarding -------------------------------------------------------------------------

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> _Reply:
        """Send one request upstream on this thread's connection (opened again once if the kept
        one was closed) and return the whole answer. A Content-Length that does not match `body`
        (a rewritten batch) is corrected."""
        size = str(len(body))
        headers = [(k, size if k.lower() == "content-length" else v) for k, v in headers]
        for attempt in range(2):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            fresh = conn is None
            if conn is None:
                conn = http.client.HTTPConnection(*self.upstream, timeout=_UPSTREAM_TIMEOUT_SECONDS)
                self._local.conn = conn
                with self._lock:
                    self._upstream_conns.add(conn)
            try:
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    conn.putheader(name, value)
                conn.endheaders(body if body else None)
                response = conn.getresponse()
                data = response.read()
            except (http.client.HTTPException, OSError):
                self.release_upstream()
                if fresh or attempt:
                    raise
                continue
            reply_headers = response.getheaders()
            if response.getheader("Transfer-Encoding", "").lower() == "chunked":
                reply_headers = [
                    (k, v) for k, v in reply_headers if k.lower() != "transfer-encoding"
                ]
                reply_headers.append(("Content-Length", str(len(data))))
            if response.will_close:
                self.release_upstream()
            return _Reply(response.status, response.reason, reply_headers, data)
        raise AssertionError("unreachable")

    def release_upstream(self) -> None:
        """Close this thread's upstream connection (its client connection ended)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
            with self._lock:
                self._upstream_conns.discard(conn)

    def handle(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> _Reply:
        target = next((v for k, v in headers if k.lower() == "x-amz-target"), "")
        if method != "POST" or not target.startswith(TARGET_PREFIX):
            return self.forward(method, path, headers, body)
        action = target[len(TARGET_PREFIX) :]
        self._count(f"action:{action}")
        if action in ("ReceiveMessage", "DeleteMessage", "DeleteMessageBatch"):
            rate = "fail_receive" if action == "ReceiveMessage" else "fail_delete"
            kind = self._draw_failure(rate)
            if kind is not None:
                self._count("failed_receives" if rate == "fail_receive" else "failed_deletes")
                return _error(kind)
            reply = self.forward(method, path, headers, body)
            if action == "ReceiveMessage" and reply.status == 200:
                answer = _json_body(reply)
                messages = answer.get("Messages") if answer is not None else None
                if isinstance(messages, list) and messages:
                    self._count("received", len(messages))
            return reply
        if action == "SendMessage":
            return self._send(path, headers, body)
        if action == "SendMessageBatch":
            return self._send_batch(path, headers, body)
        return self.forward(method, path, headers, body)

    def _send(self, path: str, headers: list[tuple[str, str]], body: bytes) -> _Reply:
        try:
            request = json.loads(body)
            message = str(request["MessageBody"])
        except (ValueError, KeyError, TypeError):
            return self.forward("POST", path, headers, body)
        fate = self._draw_send()
        if fate == "lose":
            self._count("lost")
            return _json_reply({"MessageId": str(uuid.uuid4()), "MD5OfMessageBody": _md5(message)})
        reply = self.forward("POST", path, headers, body)
        if fate == "duplicate" and reply.status == 200:
            self._count("duplicated")
            self.forward("POST", path, headers, body)
        return reply

    def _send_batch(self, path: str, headers: list[tuple[str, str]], body: bytes) -> _Reply:
        try:
            request = json.loads(body)
            entries: list[dict[str, Any]] = list(request["Entries"])
            for entry in entries:
                str(entry["Id"]), str(entry["MessageBody"])
        except (ValueError, KeyError, TypeError):
            return self.forward("POST", path, headers, body)
        fates = [self._draw_send() for _ in entries]
        kept = [e for e, fate in zip(entries, fates, strict=True) if fate != "lose"]
        lost = [e for e, fate in zip(entries, fates, strict=True) if fate == "lose"]
        twice = [e for e, fate in zip(entries, fates, strict=True) if fate == "duplicate"]
        if not lost:
            reply = self.forward("POST", path, headers, body)
            answer = None
        elif kept:
            reply = self.forward("POST", path, headers, _with_entries(request, kept))
            answer = _json_body(reply)
        else:
            reply = _json_reply({"Successful": [], "Failed": []})
            answer = {"Successful": [], "Failed": []}
        if reply.status != 200:
            return reply
        if lost:
            if answer is None or not isinstance(answer.get("Successful", []), list):
                return reply
            successful = list(answer.get("Successful") or [])
            for entry in lost:
                successful.append(
                    {
                        "Id": entry["Id"],
                        "MessageId": str(uuid.uuid4()),
                        "MD5OfMessageBody": _md5(str(entry["MessageBody"])),
                    }
                )
            answer["Successful"] = successful
            answer.setdefault("Failed", [])
            self._count("lost", len(lost))
            reply = _json_reply(answer, like=reply)
        if twice:
            self._count("duplicated", len(twice))
            self.forward("POST", path, headers, _with_entries(request, twice))
        return reply


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def _with_entries(request: dict[str, Any], entries: list[dict[str, Any]]) -> bytes:
    return json.dumps({**request, "Entries": entries}).encode()


def _json_body(reply: _Reply) -> dict[str, Any] | None:
    try:
        parsed = json.loads(reply.body)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _json_reply(document: dict[str, Any], like: _Reply | None = None) -> _Reply:
    body = json.dumps(document).encode()
    headers: list[tuple[str, str]] = []
    if like is not None:
        headers = [(k, v) for k, v in like.headers if k.lower() != "content-length"]
    else:
        headers = [("Content-Type", _JSON_TYPE), ("x-amzn-RequestId", str(uuid.uuid4()))]
    headers.append(("Content-Length", str(len(body))))
    return _Reply(200, "OK", headers, body)


def _error(kind: str) -> _Reply:
    if kind == "throttling":
        status, reason, code = 400, "Bad Request", "ThrottlingException"
    else:
        status, reason, code = 500, "Internal Server Error", "InternalError"
    body = json.dumps(
        {"__type": f"com.amazonaws.sqs#{code}", "message": "injected by the chaos proxy"}
    ).encode()
    headers = [
        ("Content-Type", _JSON_TYPE),
        ("x-amzn-RequestId", str(uuid.uuid4())),
        ("Content-Length", str(len(body))),
    ]
    return _Reply(status, reason, headers, body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a killed service) is normal here; anything else is printed."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def _handler_class(injector: SqsFaultInjector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = list(self.headers.items())
            try:
                reply = injector.handle(self.command, self.path, headers, body)
            except (http.client.HTTPException, OSError) as exc:
                message = f"upstream SQS endpoint unreachable: {exc}".encode()
                reply = _Reply(
                    502,
                    "Bad Gateway",
                    [("Content-Type", "text/plain"), ("Content-Length", str(len(message)))],
                    message,
                )
            self.send_response_only(reply.status, reply.reason)
            for name, value in reply.headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                injector.release_upstream()

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler

"""A small, test-only Lambda endpoint: the Invoke API a real boto3 client calls, and for each
function the Runtime API that the real `awslambdaric` runtime client polls.

    with LocalLambda() as lam:
        lam.add_function("echo", "my_module.handler", env={...}, timeout_seconds=30,
                         pythonpath=[...])
        settings: TASKPLAT_RELAY_LAMBDA_ENDPOINT_URL = lam.url

Invariants:
  * `POST /2015-03-31/functions/{name}/invocations` with `X-Amz-Invocation-Type: Event` queues the
    payload for the function and answers 202, exactly as Lambda accepts an asynchronous
    invocation; an unknown function answers 404 `ResourceNotFoundException`, and
    `refuse_next(name, n)` makes the next n invocations answer 429 `TooManyRequestsException`;
  * each function has its own Runtime API (`/2018-06-01/runtime/invocation/next`, `.../response`,
    `.../error`, `/2018-06-01/runtime/init/error`) on its own port, and one process
    (`python -m awslambdaric <handler>`, or the function's own `command`: a Rust `bootstrap`, or
    `node_runtime_command(...)` for a Node.js handler) that polls it, one invocation at a time,
    like one sandbox. A process that exits is started again; the invocation it held is recorded
    `crashed` and, as with Lambda's retries off, never delivered again. An invocation still
    running past its deadline (`Lambda-Runtime-Deadline-Ms`) has its process killed, `timed_out`;
  * `on_invoke`, when set, is called with each accepted invocation's request id after it was
    queued and before the 202 answer leaves (a test's hook to break the caller meanwhile);
  * `replay(invocation)` delivers the same payload again (a duplicate delivery of one
    invocation), for tests of duplicate and stale attempts;
  * everything an invocation went through is in `invocations` (thread-safe snapshots).
Not a Lambda emulator: no images, no concurrency scaling, no permissions; it serves tests only.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from taskplat.devstack.waiting import wait_for

INVOKE_PREFIX = "/2015-03-31/functions/"
RUNTIME_PREFIX = "/2018-06-01/runtime/"
REGION = "us-east-1"
ACCOUNT = "000000000000"


NODE_RUNTIME = Path(__file__).with_name("lambda_node_runtime.mjs")


def node_runtime_command(module: str | Path, export: str = "handler") -> list[str]:
    """The sandbox command of a Node.js function: Lambda's Node runtime loop (test-only
    stand-in) calling `export` of `module`."""
    return ["node", str(NODE_RUNTIME), str(module), export]


@dataclass(frozen=True)
class Invocation:
    request_id: str
    function: str
    payload: dict[str, Any]
    state: str = "queued"  # queued | running | succeeded | error | crashed | timed_out
    response: Any = None
    deadline_ms: int | None = None


@dataclass
class _Function:
    name: str
    handler: str
    env: dict[str, str]
    timeout_seconds: float
    log_path: Path
    command: tuple[str, ...] = ()
    events: queue.Queue[str] = field(default_factory=queue.Queue)
    server: ThreadingHTTPServer | None = None
    process: subprocess.Popen[bytes] | None = None
    running: str | None = None  # request id the process is handling


class LocalLambda:
    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._lock = threading.Lock()
        self._functions: dict[str, _Function] = {}
        self._invocations: dict[str, Invocation] = {}
        self._refusals: dict[str, int] = {}
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._invoke_handler())
        self._server.daemon_threads = True
        self._threads: list[threading.Thread] = []
        self.on_invoke: Callable[[str], None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LocalLambda:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._spawn_thread(self._server.serve_forever, "lambda-invoke-api")
        self._spawn_thread(self._supervise, "lambda-supervisor")

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            functions = list(self._functions.values())
        for function in functions:
            if function.process is not None and function.process.poll() is None:
                function.process.kill()
                function.process.wait(timeout=10)
            if function.server is not None:
                function.server.shutdown()
                function.server.server_close()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _spawn_thread(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- functions -----------------------------------------------------------------------------

    def add_function(
        self,
        name: str,
        handler: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
        pythonpath: Sequence[str | Path] = (),
        command: Sequence[str] = (),
    ) -> None:
        """Register a function whose sandbox runs `python -m awslambdaric <handler>`, or
        `command` when given (a custom runtime's `bootstrap`, `node_runtime_command(...)`)."""
        function_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": os.pathsep.join(str(path) for path in pythonpath),
            "PYTHONUNBUFFERED": "1",
            "AWS_LAMBDA_FUNCTION_NAME": name,
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(int(timeout_seconds)),
            "AWS_REGION": REGION,
            **(env or {}),
        }
        function = _Function(
            name,
            handler,
            function_env,
            timeout_seconds,
            self._log_dir / f"lambda-{name}.log",
            tuple(command),
        )
        function.server = ThreadingHTTPServer(("127.0.0.1", 0), self._runtime_handler(function))
        function.server.daemon_threads = True
        with self._lock:
            self._functions[name] = function
        self._spawn_thread(function.server.serve_forever, f"lambda-runtime-{name}")
        self._start_process(function)

    def _start_process(self, function: _Function) -> None:
        assert function.server is not None
        env = {
            **function.env,
            "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{function.server.server_address[1]}",
        }
        with function.log_path.open("ab") as log:
            function.process = subprocess.Popen(
                list(function.command) or [sys.executable, "-m", "awslambdaric", function.handler],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _supervise(self) -> None:
        while not self._stop.wait(0.05):
            with self._lock:
                functions = list(self._functions.values())
            for function in functions:
                self._check(function)

    def _check(self, function: _Function) -> None:
        process = function.process
        if process is None:
            return
        held = function.running
        if process.poll() is None:
            if held is None:
                return
            invocation = self._invocations[held]
            if invocation.deadline_ms is not None and time.time() * 1000 > (
                invocation.deadline_ms + 500
            ):
                process.kill()
                process.wait(timeout=10)
                self._finish(function, held, "timed_out", None)
                self._start_process(function)
            return
        if held is not None:
            self._finish(function, held, "crashed", None)
        if not self._stop.is_set():
            self._start_process(function)

    def _finish(self, function: _Function, request_id: str, state: str, response: Any) -> None:
        with self._lock:
            invocation = self._invocations[request_id]
            if invocation.state == "running":
                self._invocations[request_id] = replace(invocation, state=state, response=response)
            if function.running == request_id:
                function.running = None

    # -- control and inspection ----------------------------------------------------------------

    def refuse_next(self, function: str, count: int = 1) -> None:
        """The next `count` invocations of `function` answer 429 TooManyRequestsException."""
        with self._lock:
            self._refusals[function] = self._refusals.get(function, 0) + count

    def invocations(self, function: str | None = None) -> list[Invocation]:
        with self._lock:
            return [
                invocation
                for invocation in self._invocations.values()
                if function is None or invocation.function == function
            ]

    def replay(self, invocation: Invocation) -> str:
        """Deliver `invocation`'s payload again; the new request id."""
        return self._queue(invocation.function, invocation.payload)

    def wait_state(self, request_id: str, *states: str, timeout: float = 30.0) -> Invocation:
        def reached() -> Invocation | None:
            with self._lock:
                invocation = self._invocations[request_id]
            return invocation if invocation.state in states else None

        found = wait_for(reached, timeout=timeout, what=f"invocation {request_id} in {states}")
        assert found is not None
        return found

    def _queue(self, function_name: str, payload: dict[str, Any]) -> str:
        request_id = str(uuid.uuid4())
        with self._lock:
            function = self._functions[function_name]
            self._invocations[request_id] = Invocation(request_id, function_name, payload)
        function.events.put(request_id)
        return request_id

    # -- HTTP ----------------------------------------------------------------------------------

    def _invoke_handler(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class InvokeApi(_Quiet):
            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0]
                name = path.removeprefix(INVOKE_PREFIX).removesuffix("/invocations")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not path.startswith(INVOKE_PREFIX) or not path.endswith("/invocations"):
                    self.error(404, "UnknownOperationException", f"no route {path}")
                    return
                with endpoint._lock:
                    known = name in endpoint._functions
                    refused = endpoint._refusals.get(name, 0)
                    if refused:
                        endpoint._refusals[name] = refused - 1
                if not known:
                    self.error(404, "ResourceNotFoundException", f"Function not found: {name}")
                elif refused:
                    self.error(429, "TooManyRequestsException", "Rate Exceeded.")
                elif self.headers.get("X-Amz-Invocation-Type") != "Event":
                    self.error(400, "InvalidParameterValueException", "only Event invocations")
                else:
                    request_id = endpoint._queue(name, json.loads(body or b"{}"))
                    if endpoint.on_invoke is not None:
                        endpoint.on_invoke(request_id)
                    self.answer(202, b"", {"x-amzn-RequestId": request_id})

        return InvokeApi

    def _runtime_handler(self, function: _Function) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class RuntimeApi(_Quiet):
            def do_GET(self) -> None:
                if self.path != f"{RUNTIME_PREFIX}invocation/next":
                    self.answer(404, b"{}")
                    return
                while not endpoint._stop.is_set():
                    try:
                        request_id = function.events.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    deadline_ms = int((time.time() + function.timeout_seconds) * 1000)
                    with endpoint._lock:
                        invocation = endpoint._invocations[request_id]
                        endpoint._invocations[request_id] = replace(
                            invocation, state="running", deadline_ms=deadline_ms
                        )
                        function.running = request_id
                    arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function.name}"
                    self.answer(
                        200,
                        json.dumps(invocation.payload).encode(),
                        {
                            "Lambda-Runtime-Aws-Request-Id": request_id,
                            "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                            "Lambda-Runtime-Invoked-Function-Arn": arn,
                            "Lambda-Runtime-Trace-Id": "Root=1-00000000-000000000000000000000000",
                            "Content-Type": "application/json",
                        },
                    )
                    return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = self.path.removeprefix(RUNTIME_PREFIX).split("/")
                if parts[:1] == ["invocation"] and len(parts) == 3:
                    request_id, kind = parts[1], parts[2]
                    state = {"response": "succeeded", "error": "error"}.get(kind)
                    if state is not None and request_id in endpoint._invocations:
                        try:
                            response = json.loads(body) if body else None
                        except ValueError:
                            response = body.decode(errors="replace")
                        endpoint._finish(function, request_id, state, response)
                        self.answer(202, b'{"status":"OK"}')
                        return
                if parts[:2] == ["init", "error"]:
                    self.answer(202, b'{"status":"OK"}')
                    return
                self.answer(404, b"{}")

        return RuntimeApi


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def answer(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"Type": "User", "message": message}).encode()
        self.answer(status, body, {"x-amzn-ErrorType": code, "Content-Type": "application/json"})

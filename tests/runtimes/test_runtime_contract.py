"""One contract, three runtimes: every fixture of `contract/` runs against the Python, the
JavaScript and the Rust runtime's example operator, so they cannot drift.

A fixture (JSON) gives the task lines (`wrapper`: the worker wrapper's stdin/stdout protocol; a
string is written as it is, anything else as JSON) or the claim (`lambda`: one invocation through
the Lambda Runtime API), the dispatcher's and the Query Service's answers (`answers`, by
`METHOD /path`, served in order, the last one repeated), and what the runtime must do: the calls
it makes (`calls`: method, path, bearer credential, JSON body), the lines it writes (`lines`) or
the response it posts (`response`), and whether it dies (`exit`). `"stdout": "closed"` closes the
runtime's stdout before it writes (the reader went away): it must stop serving with exit code 1
(`"exit": "stdout_closed"`). A small recording HTTP server plays the dispatcher, the Query
Service and the Runtime API at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from taskplat.devstack.lambda_endpoint import node_runtime_command
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.runtime_builds import (
    BUILD_TIMEOUT,
    PY_OPERATOR,
    PY_OPERATOR_DIR,
    JsRuntime,
    RustRuntime,
)

# The first test to use a runtime builds it (a first Rust build is slow on a small machine).
pytestmark = [
    pytest.mark.timeout(BUILD_TIMEOUT),
    pytest.mark.prebuild("rust-runtime", "js-runtime"),
]

FIXTURES = sorted((Path(__file__).parent / "contract").glob("*.json"))
RUNTIMES = ("python", "javascript", "rust")
REQUEST_ID = "8c1b6f6e-1d9a-4a57-9a3e-0c2e5b7d9f10"
RUNTIME_PREFIX = "/2018-06-01/runtime/"


class Recorder:
    """The fixture's answers, the calls made, and the Runtime API's one invocation."""

    def __init__(self, fixture: dict[str, Any]) -> None:
        self.answers: dict[str, list[dict[str, Any]]] = {
            route: list(served) for route, served in fixture.get("answers", {}).items()
        }
        self.calls: list[dict[str, Any]] = []
        self.claim = fixture.get("claim")
        self.delivered = False
        self.posted: dict[str, Any] | None = None  # {"kind": "response" | "error", "body": ...}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def answer(self, route: str) -> dict[str, Any]:
        with self.lock:
            served = self.answers.get(route)
            if not served:
                return {"status": 404, "body": {"error": "not_found", "message": f"no {route}"}}
            return served.pop(0) if len(served) > 1 else served[0]


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A sandbox killed at the end of a test drops its kept-alive connection: not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def serve(recorder: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path != RUNTIME_PREFIX + "invocation/next":
                self.send(404, {})
                return
            with recorder.lock:
                first = not recorder.delivered
                recorder.delivered = True
            if not first or recorder.claim is None:
                recorder.stop.wait(60)  # one invocation only: the sandbox waits until killed
                self.send(503, {})
                return
            deadline_ms = int((time.time() + 30) * 1000)
            headers = {
                "Lambda-Runtime-Aws-Request-Id": REQUEST_ID,
                "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:0:function:c",
                "Lambda-Runtime-Trace-Id": "Root=1-00000000-000000000000000000000000",
            }
            self.send(200, recorder.claim, headers)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith(RUNTIME_PREFIX):
                kind = self.path.rsplit("/", 1)[-1]
                with recorder.lock:
                    recorder.posted = {"kind": kind, "path": self.path, "body": json.loads(raw)}
                self.send(202, {"status": "OK"})
                return
            with recorder.lock:
                recorder.calls.append(
                    {
                        "method": "POST",
                        "path": self.path,
                        "authorization": self.headers.get("Authorization"),
                        "body": json.loads(raw),
                    }
                )
            served = recorder.answer(f"POST {self.path}")
            self.send(served["status"], served["body"])

    server = QuietServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def command(runtime: str, contract: str, request: pytest.FixtureRequest) -> list[str]:
    if runtime == "python":
        if contract == "wrapper":
            return [sys.executable, str(PY_OPERATOR)]
        return [sys.executable, "-m", "awslambdaric", "example_operator.handler"]
    if runtime == "javascript":
        js: JsRuntime = request.getfixturevalue("js_runtime")
        if contract == "wrapper":
            return [js.node, str(js.operator)]
        return node_runtime_command(js.operator)
    rust: RustRuntime = request.getfixturevalue("rust_runtime")
    return [str(rust.bootstrap)]


@pytest.fixture
def recorder_server(request: pytest.FixtureRequest) -> Iterator[tuple[Recorder, str]]:
    fixture = json.loads(request.param.read_text())
    recorder = Recorder(fixture)
    server = serve(recorder)
    try:
        yield recorder, f"127.0.0.1:{server.server_address[1]}"
    finally:
        recorder.stop.set()
        server.shutdown()
        server.server_close()


def base_env(host: str, fixture: dict[str, Any]) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PY_OPERATOR_DIR),
        "TASKPLAT_QUERY_URL": f"http://{host}",
        **fixture.get("env", {}),
    }


@pytest.mark.parametrize(
    ("fixture_path", "recorder_server"),
    [(path, path) for path in FIXTURES],
    ids=[path.stem for path in FIXTURES],
    indirect=["recorder_server"],
)
def test_runtime_keeps_the_contract(
    fixture_path: Path,
    recorder_server: tuple[Recorder, str],
    runtime: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    fixture = json.loads(fixture_path.read_text())
    recorder, host = recorder_server
    argv = command(runtime, fixture["contract"], request)
    env = base_env(host, fixture)
    crashed = fixture.get("exit") == "crashed"
    if fixture["contract"] == "wrapper" and fixture.get("stdout") == "closed":
        returncode, stderr = run_with_stdout_closed(argv, env, task_lines(fixture))
        assert fixture.get("exit") == "stdout_closed"
        assert returncode == 1, (returncode, stderr[-3000:])
        assert "Traceback" not in stderr, stderr[-3000:]
    elif fixture["contract"] == "wrapper":
        done = subprocess.run(
            argv, input=task_lines(fixture), env=env, capture_output=True, text=True, timeout=60
        )
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        assert matches(fixture["lines"], lines), (lines, done.stderr[-3000:])
        assert (done.returncode != 0) == crashed, (done.returncode, done.stderr[-3000:])
    else:
        env.update(
            AWS_LAMBDA_RUNTIME_API=host,
            TASKPLAT_DISPATCHER_URL=f"http://{host}",
            AWS_LAMBDA_FUNCTION_NAME="contract",
            AWS_LAMBDA_FUNCTION_TIMEOUT="30",
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE="128",
            AWS_REGION="us-east-1",
            PYTHONUNBUFFERED="1",
        )
        log = tmp_path / "function.log"
        with log.open("wb") as out:
            process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(
                lambda: recorder.posted is not None or process.poll() is not None,
                timeout=30,
                what=f"the {runtime} function to answer its invocation",
            )
            if fixture.get("exit") == "after_report":
                wait_for(lambda: process.poll() is not None, timeout=10, what="the sandbox's exit")
            exited = process.poll()
        finally:
            process.kill()
            process.wait(timeout=10)
        output = log.read_text(errors="replace")[-3000:]
        if crashed:
            assert exited not in (None, 0) and recorder.posted is None, output
        elif fixture.get("exit") == "after_report":
            assert exited == 0, output
        elif fixture.get("posted") == "error":
            assert recorder.posted is not None, output
            assert recorder.posted["kind"] == "error", (recorder.posted, output)
        else:
            assert recorder.posted is not None, output
            assert recorder.posted["kind"] == "response", (recorder.posted, output)
            assert recorder.posted["body"] == fixture["response"], output
    assert matches(fixture["calls"], recorder.calls), recorder.calls


def task_lines(fixture: dict[str, Any]) -> str:
    """The fixture's task lines: a string as it is (a line that is not JSON), else as JSON."""
    return "".join(
        (task if isinstance(task, str) else json.dumps(task)) + "\n" for task in fixture["tasks"]
    )


def run_with_stdout_closed(argv: list[str], env: dict[str, str], lines: str) -> tuple[int, str]:
    """Run the runtime with the read end of its stdout closed before it writes anything; its
    exit code and stderr."""
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.close()
    try:
        _, stderr = process.communicate(lines, timeout=60)
    finally:
        process.kill()
    return process.returncode, stderr


def matches(expected: Any, actual: Any) -> bool:
    """`actual == expected`, where `{"$startswith": text}` in `expected` matches a string that
    starts with `text` (a message with a measured time in it)."""
    if isinstance(expected, dict) and set(expected) == {"$startswith"}:
        return isinstance(actual, str) and actual.startswith(expected["$startswith"])
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(matches(expected[key], actual[key]) for key in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return bool(expected == actual)

"""The pytest plugin, exercised as a user registers it, in a separate pytest process.

Invariants: the inner runs are bounded by a timeout, and their servers die with them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from taskplat.testkit.fixtures import docker_available

INNER_TESTS = """
import psycopg

from taskplat.devstack.sqs import sqs_client


def test_database(database_url):
    with psycopg.connect(database_url, connect_timeout=5) as conn:
        assert conn.execute("select current_database()").fetchone() == ("taskplat",)


def test_sqs(sqs_endpoint_url):
    client = sqs_client(sqs_endpoint_url)
    try:
        client.create_queue(QueueName="from-fixture")
        assert any(u.endswith("/from-fixture") for u in client.list_queues()["QueueUrls"])
    finally:
        client.close()


def test_testcontainers(testcontainers_postgres_url):
    assert testcontainers_postgres_url.startswith("postgresql://")
"""

CONFIGURED_TESTS = """
def test_configured(database_url, sqs_endpoint_url):
    assert database_url == "postgresql://u@127.0.0.1:1/db"
    assert sqs_endpoint_url == "http://127.0.0.1:2"
"""


FALLBACK_CONFTEST = """
from taskplat.devstack import sqs
from taskplat.devstack.errors import DevstackError


def _no_localstack(*args, **kwargs):
    raise DevstackError("simulated: no working python3.13 found")


sqs.ensure_localstack_venv = _no_localstack
"""

FALLBACK_TESTS = """
def test_sqs(sqs_endpoint_url):
    assert sqs_endpoint_url.startswith("http://127.0.0.1:")
"""


def _inner_pytest(tmp_path: Path, source: str, env: dict[str, str]) -> str:
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "test_inner.py").write_text(source)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "taskplat.testkit.fixtures",
         "-p", "no:cacheprovider", "-q", "-rs", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_plugin_starts_real_servers_and_skips_testcontainers(tmp_path: Path) -> None:
    if docker_available():
        pytest.skip("a Docker engine is reachable: the testcontainers fixture would not skip")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SQS_ENDPOINT_URL")}
    out = _inner_pytest(tmp_path, INNER_TESTS, env)
    assert "2 passed, 1 skipped" in out
    assert "no Docker engine reachable" in out


def test_plugin_uses_configured_urls(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.update(DATABASE_URL="postgresql://u@127.0.0.1:1/db", SQS_ENDPOINT_URL="http://127.0.0.1:2")
    out = _inner_pytest(tmp_path, CONFIGURED_TESTS, env)
    assert "1 passed" in out
    assert "stood in for LocalStack" not in out


def test_docker_available_is_false_without_a_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/missing.sock")
    started = time.monotonic()
    assert docker_available() is False
    assert time.monotonic() - started < 1.0


def test_docker_available_pings_the_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "d.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen()

        def answer_once() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

        thread = threading.Thread(target=answer_once, daemon=True)
        thread.start()
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        assert docker_available() is True
        thread.join(timeout=5)


def test_a_moto_fallback_is_named_in_the_run_summary(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("SQS_ENDPOINT_URL", "TASKPLAT_SQS_SERVER")
    }
    (tmp_path / "conftest.py").write_text(FALLBACK_CONFTEST)
    out = _inner_pytest(tmp_path, FALLBACK_TESTS, env)
    assert "1 passed" in out
    summary = out[out.index("SQS: moto's server stood in for LocalStack") :]
    assert "LocalStack cannot start: simulated: no working python3.13 found" in summary
    assert "make sqs-deps" in summary

"""pytest plugin: session-wide real Postgres and real SQS for tests, no Docker needed.

Register it with ``pytest_plugins = ["taskplat.testkit.fixtures"]`` in the root conftest.py (or
``-p taskplat.testkit.fixtures``).

Invariants:
- ``database_url`` / ``sqs_endpoint_url`` use ``$DATABASE_URL`` / ``$SQS_ENDPOINT_URL`` when set
  and then start and stop nothing; otherwise each starts one private server per test session
  (per xdist worker) in a pytest temporary directory and stops it, data removed, at session end.
- The servers die with the test process even if it is killed (PR_SET_PDEATHSIG).
- The testcontainers fixtures skip cleanly, with a reason, when no Docker engine is reachable or
  testcontainers is not installed; testcontainers is imported only inside them.
- Importing this module starts nothing.
- When moto's server stood in for LocalStack anywhere in the run (this plugin's endpoint or a
  stack a test started), the run's terminal summary says so, with the reason and the fix.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from types import ModuleType

import pytest

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.postgres import PrivatePostgres
from taskplat.devstack.sqs import LocalSqs, fallbacks
from taskplat.testkit.dockerprobe import docker_available

__all__ = [
    "database_url",
    "docker_available",
    "pytest_terminal_summary",
    "sqs_endpoint_url",
    "testcontainers_localstack_url",
    "testcontainers_postgres_url",
]

TESTCONTAINERS_POSTGRES_IMAGE = os.environ.get(
    "TASKPLAT_TESTCONTAINERS_POSTGRES_IMAGE", "postgres:15-alpine"
)
# LocalStack's newer images want an account; 3.8 is the last line known to run without one.
TESTCONTAINERS_LOCALSTACK_IMAGE = os.environ.get(
    "TASKPLAT_TESTCONTAINERS_LOCALSTACK_IMAGE", "localstack/localstack:3.8"
)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL of a real Postgres database (``$DATABASE_URL``, or a private cluster)."""
    if configured := os.environ.get("DATABASE_URL"):
        yield configured
        return
    server = PrivatePostgres(tmp_path_factory.mktemp("postgres"), die_with_parent=True)
    try:
        url = server.start()
    except DevstackError as exc:
        pytest.fail(f"cannot start a private Postgres: {exc}", pytrace=False)
    try:
        yield url
    finally:
        server.stop(remove_data=True)


@pytest.fixture(scope="session")
def sqs_endpoint_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An endpoint URL of a real SQS server (``$SQS_ENDPOINT_URL``, or LocalStack/moto)."""
    if configured := os.environ.get("SQS_ENDPOINT_URL"):
        yield configured
        return
    server = LocalSqs(tmp_path_factory.mktemp("sqs"), die_with_parent=True)
    try:
        url = server.start()
    except DevstackError as exc:
        pytest.fail(f"cannot start a local SQS server: {exc}", pytrace=False)
    try:
        yield url
    finally:
        # Throwaway: LocalStack keeps its queues in memory and its directory is the session's
        # temporary one, so it gets 0.5 s to end before SIGKILL (its own shutdown took 1.5 to 6 s).
        server.stop(timeout=0.5)


def _testcontainers_module(name: str) -> ModuleType:
    """``testcontainers.community.<name>`` (4.14+), else the older ``testcontainers.<name>``."""
    if not docker_available():
        pytest.skip("no Docker engine reachable")
    for module in (f"testcontainers.community.{name}", f"testcontainers.{name}"):
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    pytest.skip(f"testcontainers[{name}] is not installed")


@pytest.fixture(scope="session")
def testcontainers_postgres_url() -> Iterator[str]:
    """A Postgres URL from a testcontainers container; skipped without Docker."""
    module = _testcontainers_module("postgres")
    with module.PostgresContainer(TESTCONTAINERS_POSTGRES_IMAGE, driver=None) as container:
        url: str = container.get_connection_url()
        yield url


@pytest.fixture(scope="session")
def testcontainers_localstack_url() -> Iterator[str]:
    """An SQS endpoint URL from a testcontainers LocalStack; skipped without Docker."""
    module = _testcontainers_module("localstack")
    container = module.LocalStackContainer(image=TESTCONTAINERS_LOCALSTACK_IMAGE)
    with container.with_services("sqs", "sts", "s3", "iam") as started:
        url: str = started.get_url()
        yield url


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A section of the run's summary when LocalStack could not start and moto stood in."""
    reasons = fallbacks()
    if not reasons:
        return
    terminalreporter.write_sep("=", "SQS: moto's server stood in for LocalStack", yellow=True)
    for reason in dict.fromkeys(r.splitlines()[0] if r else "unknown error" for r in reasons):
        terminalreporter.write_line(f"LocalStack cannot start: {reason}")
    terminalreporter.write_line(
        f"{len(reasons)} SQS server(s) of this run were moto's, not LocalStack; install "
        "python3.13 (or set TASKPLAT_PYTHON313) and run `make sqs-deps` to test against LocalStack"
    )

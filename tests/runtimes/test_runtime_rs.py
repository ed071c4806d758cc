"""The Rust operator runtime: its `cargo test` suite (the wrapper protocol, and the Lambda side
against a real dispatcher: claim, heartbeat, events, steps and completion with the attempt token,
refusals of a canceled or repeated attempt)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from taskplat.common.tokens.keys import private_key_pem
from taskplat.testkit.dispatcher_harness import API_KEY, WORKER_TOKEN, Dispatcher, serve_dispatcher
from taskplat.testkit.runtime_builds import BUILD_TIMEOUT, RustRuntime

# The first test to use a runtime builds it (a first Rust build is slow on a small machine).
pytestmark = [pytest.mark.timeout(BUILD_TIMEOUT), pytest.mark.prebuild("rust-runtime")]

KEYS = {"k1": private_key_pem(b"\x31" * 32)}


@pytest.fixture
def dispatcher(db_url: str) -> Iterator[Dispatcher]:
    with serve_dispatcher(db_url, attempt_token_keys=KEYS, attempt_token_active_kid="k1") as d:
        yield d


def test_cargo_test_passes_against_the_dispatcher(
    rust_runtime: RustRuntime, dispatcher: Dispatcher
) -> None:
    env = {
        **os.environ,
        "TASKPLAT_TEST_DISPATCHER_URL": dispatcher.base_url,
        "TASKPLAT_TEST_API_KEY": API_KEY,
        "TASKPLAT_TEST_WORKER_TOKEN": WORKER_TOKEN,
    }
    done = subprocess.run(
        [rust_runtime.cargo, "test", "--offline", "--", "--test-threads=2"],
        cwd=rust_runtime.dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    # The dispatcher tests ran (they skip without the URL, saying so).
    assert "events_steps_and_the_completion_go_through_with_the_attempt_token ... ok" in done.stdout

"""The TypeScript/JavaScript operator runtime: its own `node --test` suite, run against a real
dispatcher (its Lambda handler claims, heartbeats, emits, records steps and completes with the
attempt token), and its `npm pack` tarball installed into an empty project, where both the
ES module and the CommonJS entry points load."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskplat.common.tokens.keys import private_key_pem
from taskplat.testkit.dispatcher_harness import API_KEY, WORKER_TOKEN, Dispatcher, serve_dispatcher
from taskplat.testkit.runtime_builds import BUILD_TIMEOUT, JsRuntime

# The first test to use a runtime builds it (a first Rust build is slow on a small machine).
pytestmark = [pytest.mark.timeout(BUILD_TIMEOUT), pytest.mark.prebuild("js-runtime")]

KEYS = {"k1": private_key_pem(b"\x31" * 32)}


@pytest.fixture
def dispatcher(db_url: str) -> Iterator[Dispatcher]:
    with serve_dispatcher(db_url, attempt_token_keys=KEYS, attempt_token_active_kid="k1") as d:
        yield d


def test_node_test_suite_passes_against_the_dispatcher(
    js_runtime: JsRuntime, dispatcher: Dispatcher
) -> None:
    env = {
        **os.environ,
        "TASKPLAT_TEST_DISPATCHER_URL": dispatcher.base_url,
        "TASKPLAT_TEST_API_KEY": API_KEY,
        "TASKPLAT_TEST_WORKER_TOKEN": WORKER_TOKEN,
    }
    done = subprocess.run(
        [js_runtime.node, "--test", "--test-reporter=spec", "test/"],
        cwd=js_runtime.dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped 0" in done.stdout and "fail 0" in done.stdout, done.stdout


def test_npm_pack_installs_into_an_empty_project(js_runtime: JsRuntime, tmp_path: Path) -> None:
    packed = subprocess.run(
        [js_runtime.npm, "pack", "--ignore-scripts", "--json", "--pack-destination", str(tmp_path)],
        cwd=js_runtime.dir,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    [info] = json.loads(packed.stdout[packed.stdout.index("[") :])
    files = {entry["path"] for entry in info["files"]}
    assert {"README.md", "dist/esm/index.js", "dist/esm/index.d.ts", "dist/cjs/index.js"} <= files
    assert not any(path.startswith(("src/", "test/", "node_modules/")) for path in files)
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text('{"name": "an-operator", "private": true}')
    subprocess.run(
        [
            js_runtime.npm,
            "install",
            "--offline",
            "--no-audit",
            "--no-fund",
            tmp_path / info["filename"],
        ],
        cwd=project,
        capture_output=True,
        check=True,
        timeout=120,
    )
    script = (
        "const cjs = require('@taskplat/lambda-runtime');"
        "import('@taskplat/lambda-runtime').then((esm) => console.log(JSON.stringify("
        "[typeof cjs.serve, typeof esm.taskplatHandler, typeof esm.query])));"
    )
    done = subprocess.run(
        [js_runtime.node, "-e", script], cwd=project, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == ["function", "function", "function"]

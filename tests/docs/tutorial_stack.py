"""The tutorials' code blocks as tests: Sybil runs each page of docs/tutorials/ in order, its
Python blocks in one namespace and its `sh` blocks in bash, against a stack started exactly as a
reader starts it (`python -m taskplat.devstack up`, what `make up` runs).

Invariants:
  * One stack per test process, started on first use with the operators the tutorials ask the
    reader to add (docs/tutorials/code/operators.yaml, the wrapper's own ones beside them);
    stopped (SIGTERM to its process group) at the end.
  * A page's code sees what a reader sees after `source .run/stack.env`: the stack's settings are
    in the environment of its Python blocks and of its `sh` blocks, and its working directory is
    docs/tutorials/code/.
  * `console` and `text` blocks are shown, never run; a Python or `sh` block that fails fails its
    page's test, with the block's output.
  * The pages' tests carry the `e2e` mark: they run real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Example, Sybil
from sybil.integration import pytest as sybil_pytest
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

from taskplat.devstack.ports import free_port
from taskplat.devstack.procs import group_alive
from taskplat.devstack.stack.secrets import read_env_file
from taskplat.devstack.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
CODE = TUTORIALS / "code"
START_TIMEOUT = 240.0  # a first start builds the Postgres cluster
# What the tutorials tell the reader to start `make up` with (docs/tutorials/*.md).
TUTORIAL_ENV = {"TASKPLAT_WORKER_OPERATORS_FILE": str(CODE / "operators.yaml")}


def _start(run_dir: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SQS_ENDPOINT_URL")}
    env.update(TUTORIAL_ENV, TASKPLAT_DISPATCHER_PORT=str(free_port()), TASKPLAT_WORKERS="1")
    with (run_dir.parent / "up.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "taskplat.devstack", "up", "--dir", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    env_file = run_dir / "stack.env"

    def ready() -> bool:
        if process.poll() is not None:
            output = (run_dir.parent / "up.log").read_text(errors="replace")
            raise AssertionError(f"`up` exited with {process.returncode}:\n{output[-4000:]}")
        return env_file.exists()

    wait_for(ready, timeout=START_TIMEOUT, what="the tutorials' stack", interval=0.2)
    return process, read_env_file(env_file)


@pytest.fixture(scope="session")
def tutorial_stack() -> Iterator[dict[str, str]]:
    """The settings of a running `up` stack (what `.run/stack.env` holds), also put in this
    process's environment while the tutorials run."""
    with tempfile.TemporaryDirectory(prefix="tutorials-") as scratch:
        process, values = _start(Path(scratch) / "run")
        saved = {name: os.environ.get(name) for name in values}
        os.environ.update(values)
        try:
            yield values
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            wait_for(lambda: not group_alive(process.pid), timeout=30, what="the stack to stop")


def _run_shell(example: Example) -> None:
    """An `sh` block, in bash with errors fatal, as the reader runs it."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", str(example.parsed)],
        cwd=CODE,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"the block exited with {done.returncode}:\n{example.parsed}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        )


_page_traceback = sybil_pytest.SybilItem._traceback_filter


def _traceback_filter(item: Any, excinfo: Any) -> Any:
    """Sybil cuts a failure's traceback to the page's own frames, and fails (IndexError, which
    pytest reports as an internal error that ends the whole run) when there are none: a fixture
    that failed, such as a stack that did not start. Such a failure keeps its whole traceback."""
    try:
        return _page_traceback(item, excinfo)
    except IndexError:
        return excinfo.traceback


sybil_pytest.SybilItem._traceback_filter = _traceback_filter  # type: ignore[method-assign,assignment]


def _setup(namespace: dict[str, Any]) -> None:
    namespace["__name__"] = "tutorial"
    os.chdir(CODE)


def _teardown(namespace: dict[str, Any]) -> None:
    os.chdir(ROOT)


pytest_collect_file = Sybil(
    parsers=[
        SkipParser(),
        PythonCodeBlockParser(),
        CodeBlockParser(language="sh", evaluator=_run_shell),
    ],
    path=str(TUTORIALS),
    patterns=["*.md"],
    fixtures=["tutorial_stack"],
    setup=_setup,
    teardown=_teardown,
    name="tutorials",
).pytest()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if TUTORIALS in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)

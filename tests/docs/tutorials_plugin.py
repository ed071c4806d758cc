"""pytest plugin (registered in the root conftest.py): the tutorials' code blocks
(docs/tutorials/*.md) run as tests, with Sybil, against a real stack.

How each block of a tutorial is treated:
- a ```` ```python ```` block runs in the document's namespace, in order (Sybil's
  `PythonCodeBlockParser`); the process's environment then holds the test stack's `TASKPLAT_URL`
  and `TASKPLAT_API_KEY`, as `source .run/stack.env` gives a reader, so the `Client()` a reader
  writes reaches the stack unchanged;
- a block whose info line names a file, ```` ```rust title="count-rs/src/main.rs" ````, is a file
  the reader writes: it is written to that path under the tutorials' working directory;
- a ```` ```console ```` block runs each `$ ` line with bash in that directory (the virtualenv's
  `bin` first on PATH, `TASKPLAT` naming the checkout) and fails on a non-zero exit; its other
  lines are output shown to the reader, not compared;
- every other block (```` ```sh ```` for `make up`, ```` ```yaml ````, ...) is shown, not run: the
  stack below stands in for the reader's `make up`.

Invariants:
- One stack per test process (an xdist worker), started at its first tutorial and shared by the
  tutorials it runs; its operators file is the default one plus `TUTORIAL_OPERATORS`, which is
  what the tutorials tell the reader to add (tests/docs/test_tutorial_operators.py checks that
  they show each entry). The file is written to the tutorials' working directory (the reader's
  `/home/me/tutorial`), so its `{here}` paths name the operators the tutorials write there.
- Every tutorial of a process runs in that one working directory; the environment and cwd each
  block runs with are undone after it.
- The tutorials' tests are end-to-end tests (marker `e2e`); operator-ts-rust.md also waits for
  the TypeScript and Rust runtimes' builds (`taskplat.testkit.runtime_builds`), started in the
  background as the session begins.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql
from sybil import Example, Region, Sybil
from sybil.document import Document
from sybil.integration import pytest as sybil_pytest
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer
from sybil.typing import Parser

from taskplat.devstack.stack import Stack, StackConfig
from taskplat.testkit.runtime_builds import ROOT, build_js, build_rust
from taskplat.testkit.testdb import with_database

TUTORIALS = ROOT / "docs" / "tutorials"
RUNTIMES_TUTORIAL = "operator-ts-rust.md"
COMMAND_TIMEOUT = 600.0
# A stopping wrapper waits for its open waiting claim and SQS receive: short ones stop it quickly.
QUICK_STOP = {"TASKPLAT_WORKER_POLL_WAIT_SECONDS": "1", "TASKPLAT_WORKER_WAIT_TIME_SECONDS": "1"}
# The operators the tutorials add to operators.yaml, as they show them.
TUTORIAL_OPERATORS: dict[str, dict[str, Any]] = {
    "severity": {"command": ["{python}", "{here}/severity.py"], "mode": "per-task"},
    "severity-ts": {"command": ["node", "{here}/severity-ts/severity.mjs"], "mode": "per-task"},
    "severity-rs": {"command": ["{here}/severity-rs/target/debug/severity"], "mode": "per-task"},
}


# -- the blocks ---------------------------------------------------------------------------------


def _write_file(example: Example) -> None:
    path = Path.cwd() / example.region.lexemes["title"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(example.parsed, encoding="utf-8")


def _file_blocks(document: Document) -> Iterator[Region]:
    lexer = RawFencedCodeBlockLexer(
        info_pattern=re.compile(r'(?P<language>[\w-]+) +title="(?P<title>[^"]+)"$\n', re.MULTILINE),
        mapping={"title": "title", "source": "source"},
    )
    for region in lexer(document):
        region.parsed = region.lexemes["source"]
        region.evaluator = _write_file
        yield region


def _run_console(example: Example) -> None:
    env = {
        **os.environ,
        "TASKPLAT": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for line in str(example.parsed).splitlines():
        if not line.startswith("$ "):
            continue
        command = line[2:]
        done = subprocess.run(
            ["bash", "-c", command],
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, (
            f"`{command}` exited {done.returncode}\n--- stdout\n{done.stdout}"
            f"\n--- stderr\n{done.stderr}"
        )


PARSERS: list[Parser] = [
    PythonCodeBlockParser(),
    CodeBlockParser(language="console", evaluator=_run_console),
    _file_blocks,
]


# -- the stack and each document's set-up -------------------------------------------------------


@pytest.fixture(scope="session")
def tutorial_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tutorials' working directory (the reader's /home/me/tutorial)."""
    return tmp_path_factory.mktemp("tutorial")


@pytest.fixture(scope="session")
def tutorial_stack(
    database_url: str,
    sqs_endpoint_url: str,
    tutorial_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, str]]:
    """A running stack with the tutorials' operators: the environment `.run/stack.env` gives."""
    text = resources.files("taskplat.worker_wrapper").joinpath("operators.yaml").read_text()
    document = yaml.safe_load(text)
    document["operators"].update(TUTORIAL_OPERATORS)
    operators = tutorial_dir / "operators.yaml"  # where the reader keeps it: `{here}` is there
    operators.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    database = f"tutorials_{os.getpid()}"  # one per test process, on the session's server
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    prefix = f"tutorials{os.getpid()}-"
    stack = Stack(
        StackConfig(  # what `make up` runs, on the session's Postgres and SQS endpoint
            run_dir=tmp_path_factory.mktemp("stack-tutorials"),
            workers=1,
            dispatcher_port=None,
            database_url=with_database(database_url, database),
            sqs_endpoint_url=sqs_endpoint_url,
            queue_prefix=prefix,
            dead_letter_queue=f"{prefix}dead-letters",
            env={**QUICK_STOP, "TASKPLAT_WORKER_OPERATORS_FILE": str(operators)},
            data_services=True,
        )
    )
    info = stack.start()
    try:
        yield {"TASKPLAT_URL": info.dispatcher_url, "TASKPLAT_API_KEY": info.api_key}
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def tutorial_runtimes() -> None:
    """The TypeScript runtime built (its dist/ is what the tutorial's operator imports) and the
    Rust toolchain with Debian's crates present (skips, or fails under CI=true, without them)."""
    build_js()
    build_rust()


@pytest.fixture
def tutorial_env(tutorial_stack: dict[str, str], tutorial_dir: Path) -> Iterator[None]:
    """Around each block: the stack's environment and the working directory, undone after."""
    saved_environ, saved_cwd = dict(os.environ), Path.cwd()
    os.environ.update(tutorial_stack)
    os.chdir(tutorial_dir)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)


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

_FIXTURES = ["tutorial_env"]
pytest_collect_file = (
    Sybil(
        parsers=PARSERS,
        path=str(TUTORIALS),
        patterns=["*.md"],
        excludes=["index.md", RUNTIMES_TUTORIAL],
        fixtures=_FIXTURES,
        name="tutorials",
    )
    + Sybil(
        parsers=PARSERS,
        path=str(TUTORIALS),
        filenames=[RUNTIMES_TUTORIAL],
        fixtures=[*_FIXTURES, "tutorial_runtimes"],
        name="tutorial-runtimes",
    )
).pytest()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each tutorial's examples are end-to-end tests; the runtimes' one needs their builds."""
    for item in items:
        path = Path(str(item.path))
        if path.parent != TUTORIALS:
            continue
        item.add_marker(pytest.mark.e2e)
        if path.name == RUNTIMES_TUTORIAL:
            item.add_marker(pytest.mark.prebuild("js-runtime", "rust-runtime"))

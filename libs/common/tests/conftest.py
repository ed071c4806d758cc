"""Fixtures of the common library's tests.

Invariants: `empty_db_url` is a database with nothing in it (not cloned from the migrated
template), created for one test and dropped after it, so migration tests start from nothing.
`snapshot` compares data with a committed JSON file and fails with a diff and the command that
regenerates it (`TASKPLAT_UPDATE_SNAPSHOTS=1`); it never rewrites a file unless asked to.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from taskplat.testkit.testdb import with_database

_counter = itertools.count()


@pytest.fixture
def empty_database(database_url: str) -> Iterator[Callable[[], str]]:
    """A factory of fresh, empty databases (each dropped at the end of the test)."""
    created: list[str] = []

    def make() -> str:
        name = f"tp_{os.getpid()}_empty_{next(_counter)}"
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        created.append(name)
        return with_database(database_url, name)

    yield make
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in created:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def empty_db_url(empty_database: Callable[[], str]) -> str:
    """The URL of a fresh, empty database private to this test."""
    return empty_database()


SNAPSHOTS = Path(__file__).with_name("snapshots")
UPDATE_SNAPSHOTS_ENV = "TASKPLAT_UPDATE_SNAPSHOTS"


@pytest.fixture
def snapshot() -> Callable[[str, Any], None]:
    """`snapshot(name, data)`: compare `data` with `snapshots/<name>.json`, or rewrite the file
    when TASKPLAT_UPDATE_SNAPSHOTS=1."""

    def check(name: str, data: Any) -> None:
        path = SNAPSHOTS / f"{name}.json"
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        regenerate = (
            f"If the change is intended, regenerate the snapshots with "
            f"`{UPDATE_SNAPSHOTS_ENV}=1 .venv/bin/pytest libs/common/tests` and review the diff."
        )
        if os.environ.get(UPDATE_SNAPSHOTS_ENV) == "1":
            SNAPSHOTS.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"no snapshot {path}. {regenerate}", pytrace=False)
        stored = path.read_text(encoding="utf-8")
        if stored != text:
            diff = "".join(
                difflib.unified_diff(
                    stored.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=f"{path.name} (snapshot)",
                    tofile=f"{path.name} (now)",
                )
            )
            pytest.fail(f"{name} differs from its snapshot:\n{diff}\n{regenerate}", pytrace=False)

    return check

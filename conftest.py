"""Root test fixtures shared by every package's tests.

Invariants: tests never touch a database another test uses: each test gets its own database cloned
from a migrated template; the Postgres server and the SQS endpoint come from
`taskplat.testkit.fixtures` (private processes on free ports, or DATABASE_URL / SQS_ENDPOINT_URL
from the environment when set).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from taskplat.testkit.testdb import TemplateDatabases

# tutorials_plugin (tests/docs) runs the code of docs/tutorials/*.md with Sybil.
pytest_plugins = ["taskplat.testkit.fixtures", "taskplat.testkit.prebuild", "tutorials_plugin"]


@pytest.fixture(scope="session")
def template_databases(database_url: str) -> Iterator[TemplateDatabases]:
    """A migrated template database; `clone()` gives each test a fresh copy."""
    from taskplat.common.db.migrate import apply_migrations

    databases = TemplateDatabases(database_url, prefix=f"tp_{os.getpid()}")
    databases.create_template(apply_migrations)
    yield databases
    databases.drop_all()


_counter = itertools.count()


@pytest.fixture
def db_url(template_databases: TemplateDatabases) -> Iterator[str]:
    """The URL of a fresh, migrated database private to this test."""
    url = template_databases.clone(f"t{next(_counter)}")
    yield url
    template_databases.drop(url)

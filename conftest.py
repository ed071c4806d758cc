"""Root test fixtures shared by every package's tests.

Invariants: tests never touch a database another test uses: each test gets its own database cloned
from a migrated template; the Postgres server and the SQS endpoint come from
`taskplat.testkit.fixtures` (private processes on free ports, or DATABASE_URL / SQS_ENDPOINT_URL
from the environment when set); a metric recorded in-process with a label its declaration does not
name fails the test that recorded it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from taskplat.common.metrics import clear_undeclared_labels, undeclared_labels
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


@pytest.fixture(autouse=True)
def metrics_record_only_declared_labels() -> Iterator[None]:
    """Fails a test during which an instrument of this process met a label its declaration
    (a service's metric_specs module) does not name."""
    clear_undeclared_labels()
    yield
    found = undeclared_labels()
    clear_undeclared_labels()
    if found:
        listed = "; ".join(f"{metric}: {', '.join(labels)}" for metric, labels in found)
        pytest.fail(f"metrics recorded with labels they do not declare: {listed}")


_counter = itertools.count()


@pytest.fixture
def db_url(template_databases: TemplateDatabases) -> Iterator[str]:
    """The URL of a fresh, migrated database private to this test."""
    url = template_databases.clone(f"t{next(_counter)}")
    yield url
    template_databases.drop(url)

"""Per-test databases cloned from a migrated template.

Invariants: the template is created once per test session and never connected to after migration
(CREATE DATABASE ... TEMPLATE needs it idle); every clone has a unique name under the session's
prefix, and `drop_all()` removes every database the session created, even after a failed test.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


class TemplateDatabases:
    def __init__(self, server_url: str, *, prefix: str) -> None:
        self._server_url = server_url
        self._prefix = prefix
        self._template = f"{prefix}_template"
        self._created: set[str] = set()

    def _admin(self, statement: sql.Composed) -> None:
        with psycopg.connect(self._server_url, autocommit=True) as conn:
            conn.execute(statement)

    def create_template(self, migrate: Callable[[str], object]) -> str:
        self._admin(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(self._template)
            )
        )
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self._template)))
        self._created.add(self._template)
        url = with_database(self._server_url, self._template)
        migrate(url)
        return url

    def clone(self, name: str) -> str:
        database = f"{self._prefix}_{name}"
        self._admin(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
        self._admin(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(database), sql.Identifier(self._template)
            )
        )
        self._created.add(database)
        return with_database(self._server_url, database)

    def drop(self, url: str) -> None:
        database = urlsplit(url).path.lstrip("/")
        self._admin(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
        self._created.discard(database)

    def drop_all(self) -> None:
        for database in sorted(self._created):
            self._admin(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
        self._created.clear()

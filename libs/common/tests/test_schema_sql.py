"""`schema.sql` is the schema the migrations leave: a migration that changes the schema without
`make schema` fails here, and the file never drifts from what a fresh database gets."""

from __future__ import annotations

import difflib

from taskplat.devstack.schema_dump import dump_schema, schema_sql_path


def test_schema_sql_is_what_the_migrations_leave(db_url: str) -> None:
    expected = schema_sql_path().read_text()
    actual = dump_schema(db_url)
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                "schema.sql",
                "migrated database",
                n=2,
            )
        )
        raise AssertionError(
            f"schema.sql disagrees with the migrations: run `make schema`\n{diff[:4000]}"
        )

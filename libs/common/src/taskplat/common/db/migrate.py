"""Forward-only migration runner.

Invariants: migrations are the numbered files `migrations/NNNN_name.sql` shipped in this package,
applied in order, each in its own transaction together with its row in `schema_migrations`. A
session-level advisory lock serialises concurrent runners (several containers may start at once),
so each version is applied exactly once; running again applies nothing. A database that records a
version this code does not know is refused (the code is older than the schema).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString, cast

import psycopg
from psycopg import sql

MIGRATIONS_PACKAGE = "taskplat.common.db.migrations"
# An arbitrary, fixed key: pg_advisory_lock(bigint) serialises every migration runner.
ADVISORY_LOCK_KEY = 0x7461736B706C6174  # "taskplat"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


class MigrationError(Exception):
    pass


def available_migrations() -> list[Migration]:
    """Every migration shipped with this package, in version order."""
    found: list[Migration] = []
    for entry in resources.files(MIGRATIONS_PACKAGE).iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(
                Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda migration: migration.version)
    versions = [migration.version for migration in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {versions}")
    return found


def apply_migrations(database_url: str) -> list[int]:
    """Apply every pending migration; return the versions applied (empty when up to date)."""
    applied: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_KEY,))
        try:
            conn.execute(
                """
                CREATE TABLE IF NOT EXISTS schema_migrations (
                    version    integer PRIMARY KEY,
                    name       text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )
                """
            )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            migrations = available_migrations()
            unknown = done - {migration.version for migration in migrations}
            if unknown:
                raise MigrationError(
                    f"database has migrations {sorted(unknown)} that this code does not know"
                )
            for migration in migrations:
                if migration.version in done:
                    continue
                with conn.transaction():
                    # Migration files are trusted SQL shipped in this package.
                    conn.execute(sql.SQL(cast(LiteralString, migration.sql)))  # type: ignore[redundant-cast]
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                applied.append(migration.version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))
    return applied


def main(argv: list[str] | None = None) -> int:
    """Entry point `taskplat-migrate`: apply pending migrations to DATABASE_URL."""
    from taskplat.common.logging import configure_logging, get_logger
    from taskplat.common.settings import DatabaseSettings, ServiceSettings

    parser = argparse.ArgumentParser(
        prog="taskplat-migrate", description="Apply pending Taskplat migrations to DATABASE_URL."
    )
    parser.add_argument("--database-url", help="override DATABASE_URL")
    args = parser.parse_args(argv)
    service = ServiceSettings()
    configure_logging("migrate", level=service.log_level, fmt=service.log_format)
    log = get_logger()
    url = args.database_url or DatabaseSettings().database_url.get_secret_value()
    try:
        applied = apply_migrations(url)
    except (psycopg.Error, MigrationError) as exc:
        message = " ".join(str(exc).split())
        log.error("migrate_failed", error=message)
        print(f"taskplat-migrate: {message}", file=sys.stderr)
        return 1
    log.info("migrate_done", applied=applied, latest=available_migrations()[-1].version)
    return 0


if __name__ == "__main__":
    sys.exit(main())

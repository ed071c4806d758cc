"""Forward-only migration runner, safe to run against a live database.

Invariants:
  * migrations are the numbered files `migrations/NNNN_name.sql` shipped in this package, applied
    in order; each is recorded in `schema_migrations` with the sha256 of its text. A session-level
    advisory lock serialises concurrent runners (several containers may start at once), so each
    version is applied exactly once; running again applies nothing.
  * a database that records a version this code does not know is refused (the code is older than
    the schema); so is one whose recorded checksum differs from the file's (an applied migration
    was edited: write a new one instead). A version recorded before checksums existed gets the
    file's checksum recorded on the next run. The one allowance: a migration listed in `REWORDED`
    had only its comments changed after it shipped; the checksum it was applied with is accepted
    and replaced by the file's (its SQL, comments aside, is held to the listed hash by a test).
  * every statement runs with `lock_timeout` and `statement_timeout` set (after the advisory lock
    is taken, so a runner may wait for another): a migration that would queue behind a long
    transaction, and so block every query queued behind it, fails fast instead; nothing of it is
    recorded, and running again retries it.
  * a migration runs in one transaction with its `schema_migrations` row, unless its header
    declares `-- taskplat: no-transaction`: then each `;`-terminated statement (one ending a
    line) runs on its own in autocommit, as `CREATE INDEX CONCURRENTLY` needs, and the version is
    recorded after the last one. Such a migration must be safe to run again from the start (`IF
    NOT EXISTS`, dropping an invalid index first), since a failure can leave its first steps done.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import LiteralString, cast

import psycopg
from psycopg import sql

MIGRATIONS_PACKAGE = "taskplat.common.db.migrations"
# An arbitrary, fixed key: pg_advisory_lock(bigint) serialises every migration runner.
ADVISORY_LOCK_KEY = 0x7461736B706C6174  # "taskplat"
NO_TRANSACTION = "-- taskplat: no-transaction"
DEFAULT_LOCK_TIMEOUT_SECONDS = 5.0
DEFAULT_STATEMENT_TIMEOUT_SECONDS = 900.0
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# A statement of a no-transaction migration ends with `;` at the end of a line.
_STATEMENT_END = re.compile(r";[ \t]*(?:--[^\n]*)?$", re.MULTILINE)


# Migrations whose comments were reworded after they shipped (their SQL is unchanged): version ->
# (the checksum of the text they were applied with, sha256 of the current text without comments).
REWORDED: dict[int, tuple[str, str]] = {
    1: (
        "ffa4704ab433c287cb69705372f939df63e7fc4f0cabe501c96cf69b9fa803ba",
        "0a1b7486a5096efd273f3beb51963e737c6f2b484802d60bb4732b369e2e0e40",
    ),
    5: (
        "7fe86fc1e1e2f1aeb630945a239a647aeffd4293e7c7110fb09b866b69b23786",
        "f14a39dad935574264a3ff47b0c531fa5f83495cbbbfdf9cdb7d56acebc4930d",
    ),
    9: (
        "4dc85c7f3beafbdf5c75d33d01eaea3a6c15129553ca47a84f83ffc5c5e73b7c",
        "94d02256334eaa25ebd69a20a4ba0809164418f5de8b15d531850f7723018977",
    ),
    10: (
        "24c8301a26454b92672fe9328961932fbcd5b716467c4f398bbfbd3c09d0556d",
        "23a6c22a754f177836fa415e81b2faa47e94243505bbd94d7441c61b2ecf6bd0",
    ),
}
_COMMENT = re.compile(r"--.*$")


def code_checksum(sql: str) -> str:
    """sha256 of `sql` without its `--` comments and blank lines (how `REWORDED` is checked)."""
    lines = (_COMMENT.sub("", line).rstrip() for line in sql.splitlines())
    return hashlib.sha256("\n".join(line for line in lines if line.strip()).encode()).hexdigest()


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    def applied_as_is(self, recorded: str | None) -> bool:
        """Whether a recorded checksum is this text's, or the one it had before a rewording."""
        if recorded is None or recorded == self.checksum:
            return True
        return recorded == REWORDED.get(self.version, ("", ""))[0]

    @property
    def transactional(self) -> bool:
        """False when the header (the leading comment lines) declares `NO_TRANSACTION`."""
        for line in self.sql.splitlines():
            stripped = line.strip()
            if not stripped:
                continue
            if not stripped.startswith("--"):
                return True
            if stripped == NO_TRANSACTION:
                return False
        return True

    def statements(self) -> list[str]:
        """The statements of a no-transaction migration, in order (comments kept)."""
        found: list[str] = []
        start = 0
        for match in _STATEMENT_END.finditer(self.sql):
            statement = self.sql[start : match.start()].strip()
            start = match.end()
            if _has_code(statement):
                found.append(statement)
        if _has_code(self.sql[start:]):
            raise MigrationError(
                f"migration {self.version:04d}: text after the last ';' (every statement of a "
                "no-transaction migration ends with ';' at the end of a line)"
            )
        return found


@dataclass(frozen=True)
class MigrationState:
    version: int
    name: str
    applied_at: datetime | None  # None: pending
    edited: bool = False  # applied, but the file's checksum differs from the recorded one


class MigrationError(Exception):
    pass


def _has_code(text: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


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


def _ensure_table(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS schema_migrations (
            version    integer PRIMARY KEY,
            name       text NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # Databases migrated before checksums were kept get the column; their rows adopt the
    # checksums of the shipped files (below).
    conn.execute("ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text")


def _set_timeouts(
    conn: psycopg.Connection[tuple[object, ...]], lock_timeout: float, statement_timeout: float
) -> None:
    for name, seconds in (("lock_timeout", lock_timeout), ("statement_timeout", statement_timeout)):
        conn.execute(
            "SELECT set_config(%s, %s, false)", (name, f"{max(0, round(seconds * 1000))}ms")
        )


def _check_recorded(
    conn: psycopg.Connection[tuple[object, ...]], migrations: Sequence[Migration]
) -> set[int]:
    """The applied versions, after refusing unknown or edited ones and adopting checksums."""
    by_version = {migration.version: migration for migration in migrations}
    rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
    done = {cast(int, version) for version, _ in rows}
    unknown = done - set(by_version)
    if unknown:
        raise MigrationError(
            f"database has migrations {sorted(unknown)} that this code does not know"
        )
    edited = sorted(
        cast(int, version)
        for version, checksum in rows
        if not by_version[cast(int, version)].applied_as_is(cast(str | None, checksum))
    )
    if edited:
        raise MigrationError(
            f"applied migrations {edited} were edited since (their checksums differ): "
            "restore them and write a new migration instead"
        )
    for version, checksum in rows:
        current = by_version[cast(int, version)].checksum
        if checksum != current:  # recorded before checksums were kept, or reworded since
            conn.execute(
                "UPDATE schema_migrations SET checksum = %s WHERE version = %s",
                (current, version),
            )
    return done


def _record(conn: psycopg.Connection[tuple[object, ...]], migration: Migration) -> None:
    conn.execute(
        "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
        (migration.version, migration.name, migration.checksum),
    )


def _apply(conn: psycopg.Connection[tuple[object, ...]], migration: Migration) -> None:
    # Migration files are trusted SQL shipped in this package.
    if migration.transactional:
        with conn.transaction():
            conn.execute(sql.SQL(cast(LiteralString, migration.sql)))  # type: ignore[redundant-cast]
            _record(conn, migration)
        return
    for statement in migration.statements():
        conn.execute(sql.SQL(cast(LiteralString, statement)))  # type: ignore[redundant-cast]
    _record(conn, migration)


def apply_migrations(
    database_url: str,
    *,
    lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    statement_timeout_seconds: float = DEFAULT_STATEMENT_TIMEOUT_SECONDS,
    migrations: Sequence[Migration] | None = None,
) -> list[int]:
    """Apply every pending migration; return the versions applied (empty when up to date).

    `migrations` defaults to the shipped ones (tests pass others)."""
    migrations = list(migrations) if migrations is not None else available_migrations()
    applied: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_KEY,))
        try:
            _set_timeouts(conn, lock_timeout_seconds, statement_timeout_seconds)
            _ensure_table(conn)
            done = _check_recorded(conn, migrations)
            for migration in migrations:
                if migration.version not in done:
                    _apply(conn, migration)
                    applied.append(migration.version)
        finally:
            _set_timeouts(conn, 0, 0)
            conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))
    return applied


def migration_status(
    database_url: str, migrations: Sequence[Migration] | None = None
) -> list[MigrationState]:
    """Every known migration, applied (when, and whether edited since) or pending; read-only."""
    migrations = list(migrations) if migrations is not None else available_migrations()
    with psycopg.connect(database_url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        recorded: dict[int, tuple[datetime, str | None]] = {}
        if exists and exists[0]:
            has_checksum = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE "
                "table_name = 'schema_migrations' AND column_name = 'checksum' "
                "AND table_schema = current_schema())"
            ).fetchone()
            query = (
                "SELECT version, applied_at, checksum FROM schema_migrations"
                if has_checksum and has_checksum[0]
                else "SELECT version, applied_at, NULL FROM schema_migrations"
            )
            for version, applied_at, checksum in conn.execute(query).fetchall():
                recorded[cast(int, version)] = (
                    cast(datetime, applied_at),
                    cast(str | None, checksum),
                )
    states: list[MigrationState] = []
    for migration in migrations:
        row = recorded.get(migration.version)
        if row is None:
            states.append(MigrationState(migration.version, migration.name, None))
        else:
            edited = not migration.applied_as_is(row[1])
            states.append(MigrationState(migration.version, migration.name, row[0], edited))
    return states


def _print_status(states: Sequence[MigrationState]) -> None:
    for state in states:
        if state.applied_at is None:
            print(f"pending  {state.version:04d}_{state.name}")
        else:
            note = "  EDITED since it was applied" if state.edited else ""
            print(
                f"applied  {state.version:04d}_{state.name}  {state.applied_at.isoformat()}{note}"
            )
    pending = sum(1 for state in states if state.applied_at is None)
    print(f"{len(states) - pending} applied, {pending} pending")


def main(argv: list[str] | None = None) -> int:
    """Entry point `taskplat-migrate [apply|status]`: apply pending migrations to DATABASE_URL,
    or list the applied and pending ones."""
    from taskplat.common.logging import configure_logging, get_logger
    from taskplat.common.settings import DatabaseSettings, MigrateSettings, ServiceSettings

    parser = argparse.ArgumentParser(
        prog="taskplat-migrate",
        description="Apply pending Taskplat migrations to DATABASE_URL (`apply`, the default), "
        "or list the applied and pending ones (`status`).",
    )
    parser.add_argument("command", nargs="?", choices=("apply", "status"), default="apply")
    parser.add_argument("--database-url", help="override DATABASE_URL")
    args = parser.parse_args(argv)
    service = ServiceSettings()
    configure_logging("migrate", level=service.log_level, fmt=service.log_format)
    log = get_logger()
    try:
        url = args.database_url or DatabaseSettings().database_url.get_secret_value()
        timeouts = MigrateSettings()
        if args.command == "status":
            states = migration_status(url)
            _print_status(states)
            return 1 if any(state.edited for state in states) else 0
        applied = apply_migrations(
            url,
            lock_timeout_seconds=timeouts.lock_timeout_seconds,
            statement_timeout_seconds=timeouts.statement_timeout_seconds,
        )
    except (psycopg.Error, MigrationError) as exc:
        message = " ".join(str(exc).split())
        log.error("migrate_failed", error=message)
        print(f"taskplat-migrate: {message}", file=sys.stderr)
        return 1
    log.info("migrate_done", applied=applied, latest=available_migrations()[-1].version)
    return 0


if __name__ == "__main__":
    sys.exit(main())

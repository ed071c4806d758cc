"""The migration runner: all migrations on an empty database give the committed schema; running
again applies nothing; concurrent runners apply each version once; edited migrations are refused
(checksums); lock and statement timeouts; no-transaction migrations; the CLI fails in one line and
lists applied and pending migrations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from taskplat.common.db.migrate import (
    REWORDED,
    Migration,
    MigrationError,
    apply_migrations,
    available_migrations,
    code_checksum,
    migration_status,
)
from taskplat.common.db.queries import parse_queries
from taskplat.devstack.ports import free_port

_SQL_PATH = Path(__file__).with_name("schema_introspection.sql")
INTROSPECTION = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))


def introspect(url: str) -> dict[str, list[dict[str, Any]]]:
    """Tables and views with their columns, indexes, constraints, functions, sequences, triggers
    and applied migration versions, as JSON-ready rows."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return {
            name: json.loads(json.dumps(conn.execute(query).fetchall(), default=str))
            for name, query in INTROSPECTION.items()
        }


def test_all_migrations_on_an_empty_database_give_the_committed_schema(
    empty_db_url: str, db_url: str, snapshot: Callable[[str, Any], None]
) -> None:
    versions = [migration.version for migration in available_migrations()]
    assert versions == sorted(set(versions)) and versions[0] == 1
    assert apply_migrations(empty_db_url) == versions
    schema = introspect(empty_db_url)
    assert [row["version"] for row in schema["migrations"]] == versions
    tables = {row["table_name"] for row in schema["columns"] if row["table_type"] == "BASE TABLE"}
    assert tables == {
        "tasks", "task_attempts", "task_outputs", "task_events", "outbox", "schema_migrations",
        "datasets", "dataset_versions", "dags", "jobs", "job_inputs", "job_outputs",
        "event_routes", "task_pins", "event_positions",
        "queues", "queue_keys",
        "dataset_buffers", "dataset_tables", "task_steps",
        "api_keys", "audit_log", "workers",
    }  # fmt: skip
    snapshot("db_schema", schema)
    # The tests' template databases are migrated by the same runner: same schema.
    assert introspect(db_url) == schema

    # Running again applies nothing and changes nothing.
    assert apply_migrations(empty_db_url) == []
    assert introspect(empty_db_url) == schema


def _apply_at_barrier(url: str, barrier: threading.Barrier) -> list[int]:
    barrier.wait(timeout=30)
    return apply_migrations(url)


def test_concurrent_runners_apply_each_version_once(
    empty_database: Callable[[], str],
) -> None:
    versions = [migration.version for migration in available_migrations()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(3):
            url = empty_database()
            barrier = threading.Barrier(2)
            futures = [pool.submit(_apply_at_barrier, url, barrier) for _ in range(2)]
            results = [future.result(timeout=60) for future in futures]
            assert sorted(results) == [[], versions]
            with psycopg.connect(url) as conn:
                rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version")
                assert [row[0] for row in rows.fetchall()] == versions


def test_a_database_ahead_of_the_code_is_refused(empty_db_url: str) -> None:
    apply_migrations(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (9999, 'future')")
    with pytest.raises(MigrationError, match=r"\[9999\]"):
        apply_migrations(empty_db_url)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "taskplat.common.db.migrate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def _message_lines(stderr: str) -> list[str]:
    """Lines of stderr that are not JSON log records."""
    lines = []
    for line in stderr.splitlines():
        try:
            json.loads(line)
        except ValueError:
            lines.append(line)
    return lines


def test_the_cli_fails_in_one_line_when_the_database_is_unreachable() -> None:
    port = free_port()
    result = _run_cli("--database-url", f"postgresql://taskplat@127.0.0.1:{port}/taskplat")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = _message_lines(result.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("taskplat-migrate: ") and str(port) in lines[0]


def test_the_cli_fails_in_one_line_for_a_missing_database(database_url: str) -> None:
    missing = database_url.rsplit("/", 1)[0] + "/tp_no_such_database"
    result = _run_cli("--database-url", missing)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    (line,) = _message_lines(result.stderr)
    assert line.startswith("taskplat-migrate: ") and "tp_no_such_database" in line


def test_the_cli_applies_pending_migrations_and_lists_them(empty_db_url: str) -> None:
    names = [f"{m.version:04d}_{m.name}" for m in available_migrations()]
    before = _run_cli("status", "--database-url", empty_db_url)
    assert before.returncode == 0, before.stderr
    assert [line.split()[:2] for line in before.stdout.splitlines()[:-1]] == [
        ["pending", name] for name in names
    ]
    result = _run_cli("--database-url", empty_db_url)
    assert result.returncode == 0, result.stderr
    again = _run_cli("apply", "--database-url", empty_db_url)
    assert again.returncode == 0, again.stderr
    assert apply_migrations(empty_db_url) == []
    after = _run_cli("status", "--database-url", empty_db_url)
    assert after.returncode == 0, after.stderr
    assert [line.split()[:2] for line in after.stdout.splitlines()[:-1]] == [
        ["applied", name] for name in names
    ]
    assert after.stdout.splitlines()[-1] == f"{len(names)} applied, 0 pending"


TABLE = Migration(1, "table", "CREATE TABLE a (x integer);\n")
COLUMN = Migration(2, "column", "ALTER TABLE a ADD COLUMN y integer;\n")
CONCURRENT_SQL = """-- Indexes built without blocking writes.
-- taskplat: no-transaction
DROP INDEX CONCURRENTLY IF EXISTS a_x_idx;
CREATE INDEX CONCURRENTLY IF NOT EXISTS a_x_idx ON a (x);  -- the index
CREATE INDEX CONCURRENTLY IF NOT EXISTS a_y_idx
    ON a (y);
"""


def _recorded(url: str) -> dict[int, str | None]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
    return {int(version): checksum for version, checksum in rows}


def test_checksums_are_recorded_and_an_edited_migration_is_refused(empty_db_url: str) -> None:
    assert apply_migrations(empty_db_url, migrations=[TABLE, COLUMN]) == [1, 2]
    assert _recorded(empty_db_url) == {1: TABLE.checksum, 2: COLUMN.checksum}
    edited = Migration(1, "table", "CREATE TABLE a (x bigint);\n")
    with pytest.raises(MigrationError, match=r"\[1\] were edited"):
        apply_migrations(empty_db_url, migrations=[edited, COLUMN])
    states = migration_status(empty_db_url, [edited, COLUMN, Migration(3, "later", "SELECT 1;")])
    assert [(s.version, s.applied_at is not None, s.edited) for s in states] == [
        (1, True, True),
        (2, True, False),
        (3, False, False),
    ]


def test_a_database_migrated_before_checksums_adopts_them(empty_db_url: str) -> None:
    apply_migrations(empty_db_url, migrations=[TABLE])
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE schema_migrations DROP COLUMN checksum")
    assert [s.applied_at is not None for s in migration_status(empty_db_url, [TABLE])] == [True]
    assert apply_migrations(empty_db_url, migrations=[TABLE, COLUMN]) == [2]
    assert _recorded(empty_db_url) == {1: TABLE.checksum, 2: COLUMN.checksum}


def test_a_reworded_migration_is_accepted_with_its_old_checksum_and_adopts_the_new(
    empty_db_url: str,
) -> None:
    shipped = available_migrations()
    reworded = next(m for m in shipped if m.version == 1)
    old_checksum = REWORDED[1][0]
    apply_migrations(empty_db_url, migrations=shipped[:1])
    with psycopg.connect(empty_db_url, autocommit=True) as conn:  # applied before the rewording
        conn.execute(
            "UPDATE schema_migrations SET checksum = %s WHERE version = 1", (old_checksum,)
        )
    assert [s.edited for s in migration_status(empty_db_url, shipped[:1])] == [False]
    apply_migrations(empty_db_url, migrations=shipped[:1])
    assert _recorded(empty_db_url) == {1: reworded.checksum}
    # Any other checksum is still an edit.
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 1")
    with pytest.raises(MigrationError, match=r"\[1\] were edited"):
        apply_migrations(empty_db_url, migrations=shipped[:1])


def test_reworded_migrations_changed_nothing_but_comments() -> None:
    by_version = {m.version: m for m in available_migrations()}
    for version, (_, code) in REWORDED.items():
        assert code_checksum(by_version[version].sql) == code, (
            f"migration {version} changed beyond its comments since it was reworded"
        )
    assert code_checksum("SELECT 1; -- a\n\n-- b\nSELECT 2;\n") == code_checksum(
        "SELECT 1;\nSELECT 2; -- c"
    )


def test_a_no_transaction_migration_runs_each_statement_on_its_own(empty_db_url: str) -> None:
    concurrent = Migration(3, "concurrent", CONCURRENT_SQL)
    assert not concurrent.transactional and TABLE.transactional
    assert len(concurrent.statements()) == 3
    # Inside a transaction, CREATE INDEX CONCURRENTLY is refused, and nothing is recorded.
    in_transaction = Migration(3, "concurrent", CONCURRENT_SQL.replace("-- taskplat: ", "-- "))
    assert in_transaction.transactional
    apply_migrations(empty_db_url, migrations=[TABLE, COLUMN])
    with pytest.raises(psycopg.errors.ActiveSqlTransaction):
        apply_migrations(empty_db_url, migrations=[TABLE, COLUMN, in_transaction])
    assert set(_recorded(empty_db_url)) == {1, 2}

    assert apply_migrations(empty_db_url, migrations=[TABLE, COLUMN, concurrent]) == [3]
    with psycopg.connect(empty_db_url) as conn:
        valid = conn.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index AS i "
            "JOIN pg_class AS c ON c.oid = i.indexrelid WHERE c.relname LIKE 'a\\_%%_idx' "
            "ORDER BY 1"
        ).fetchall()
    assert valid == [("a_x_idx", True), ("a_y_idx", True)]
    with pytest.raises(MigrationError, match="after the last"):
        Migration(4, "open", "-- taskplat: no-transaction\nSELECT 1").statements()


def test_a_migration_behind_a_long_transaction_times_out_and_can_be_retried(
    empty_db_url: str,
) -> None:
    apply_migrations(empty_db_url, migrations=[TABLE])
    with psycopg.connect(empty_db_url) as reader:
        reader.execute("SELECT * FROM a").fetchall()  # holds its lock until the transaction ends
        with pytest.raises(psycopg.errors.LockNotAvailable):
            apply_migrations(empty_db_url, migrations=[TABLE, COLUMN], lock_timeout_seconds=0.2)
        assert set(_recorded(empty_db_url)) == {1}
    assert apply_migrations(empty_db_url, migrations=[TABLE, COLUMN]) == [2]
    slow = Migration(3, "slow", "SELECT pg_sleep(5);\n")
    with pytest.raises(psycopg.errors.QueryCanceled):
        apply_migrations(
            empty_db_url, migrations=[TABLE, COLUMN, slow], statement_timeout_seconds=0.2
        )
    assert set(_recorded(empty_db_url)) == {1, 2}

"""The migration runner: all migrations on an empty database give the committed schema; running
again applies nothing; concurrent runners apply each version once; the CLI fails in one line."""

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

from taskplat.common.db.migrate import MigrationError, apply_migrations, available_migrations
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
        "event_routes", "task_pins",
        "queues",
        "dataset_buffers", "dataset_tables", "task_steps",
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


def test_the_cli_applies_pending_migrations(empty_db_url: str) -> None:
    result = _run_cli("--database-url", empty_db_url)
    assert result.returncode == 0, result.stderr
    again = _run_cli("--database-url", empty_db_url)
    assert again.returncode == 0, again.stderr
    assert apply_migrations(empty_db_url) == []

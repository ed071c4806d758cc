"""Every way out of the token's inputs answers 403 naming it, before anything runs.

Against a real Postgres (the `taskplat_query` role), LocalStack's S3 and the real service: one
test per refused form (another dataset, the catalogs, the platform's tables, local files, URLs,
ATTACH, COPY, SET, PRAGMA, INSTALL/LOAD, table functions, a second statement, writes), then a
table of escape attempts. "Nothing ran" is observed three ways: the service opened no DuckDB for
the request (`taskplat_query_engines_opened` unchanged), no file a statement names was written,
and the refused input's S3 object and Postgres table are never asked for (the statement never
reached an engine that could).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from query_harness import (
    BUCKET,
    Dataset,
    ask,
    aws,
    buffered_dataset,
    mint,
    query_user,
    s3_dataset,
    served,
    settings,
)

from taskplat.testkit.testdb import TemplateDatabases


class World:
    def __init__(self, client: httpx.Client, alerts: Dataset, other: Dataset, other_s3: Dataset):
        self.client = client
        self.alerts = alerts
        self.other = other
        self.other_s3 = other_s3
        self.token = mint([alerts])

    def engines(self) -> int:
        text = self.client.get("/metrics").text
        found = re.search(r"^taskplat_query_engines_opened_total (\d+(\.\d+)?)$", text, re.M)
        return int(float(found.group(1))) if found else 0

    def refused(self, sql: str, *names: str) -> None:
        """`sql` answers 403 naming each of `names`, and opens no engine."""
        before = self.engines()
        answer = ask(self.client, self.token, sql)
        assert answer.status_code == 403, f"{sql!r} -> {answer.status_code} {answer.text}"
        body = answer.json()
        assert body["error"] == "refused"
        for name in names:
            assert name.lower() in body["message"].lower(), (sql, body["message"])
        assert self.engines() == before, f"{sql!r} opened an engine"


@pytest.fixture(scope="module")
def world(template_databases: TemplateDatabases, sqs_endpoint_url: str) -> Iterator[World]:
    s3 = aws("s3", sqs_endpoint_url)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    db_url = template_databases.clone("escapes")
    try:
        alerts = buffered_dataset(
            db_url, "alerts", [{"name": "block", "type": "bigint"}], [{"block": 1}]
        )
        other = buffered_dataset(
            db_url, "payroll", [{"name": "salary", "type": "bigint"}], [{"salary": 100}]
        )
        other_s3 = s3_dataset(db_url, sqs_endpoint_url, "keys", "SELECT 'secret' AS k")
        with query_user(db_url) as reader, served(settings(reader, sqs_endpoint_url)) as client:
            world = World(client, alerts, other, other_s3)
            answer = ask(client, world.token, "SELECT count(*) FROM alerts")
            assert answer.json()["rows"] == [[1]]  # the allowed view does answer
            yield world
    finally:
        template_databases.drop(db_url)


def test_another_datasets_table(world: World) -> None:
    other = world.other
    world.refused("SELECT * FROM payroll", "payroll")
    world.refused(f"SELECT * FROM dataset_{other.dataset_uuid.hex}", other.dataset_uuid.hex)
    world.refused(f'SELECT * FROM "{other.table}"', str(other.table))
    world.refused(f'SELECT * FROM taskplat_pg.public."{other.table}"', "taskplat_pg")


def test_the_catalogs(world: World) -> None:
    world.refused("SELECT * FROM pg_catalog.pg_class", "pg_catalog.pg_class")
    world.refused("SELECT * FROM pg_class", "pg_class")
    world.refused("SELECT * FROM information_schema.tables", "information_schema.tables")
    world.refused("SELECT * FROM duckdb_tables", "duckdb_tables")


def test_the_platforms_tables(world: World) -> None:
    world.refused("SELECT * FROM tasks", "tasks")
    world.refused("SELECT * FROM taskplat_pg.public.tasks", "taskplat_pg.public.tasks")
    world.refused("SELECT * FROM datasets", "datasets")


def test_local_files(world: World, tmp_path: Path) -> None:
    world.refused("SELECT * FROM read_csv('/etc/passwd')", "read_csv")
    world.refused("SELECT * FROM '/etc/passwd'", "/etc/passwd")
    world.refused("SELECT * FROM read_text('/etc/hostname')", "read_text")
    world.refused(f"SELECT * FROM glob('{tmp_path}/*')", "glob")


def test_urls(world: World) -> None:
    world.refused("SELECT * FROM read_parquet('https://example.com/x.parquet')", "read_parquet")
    other = world.other_s3
    world.refused(
        f"SELECT * FROM read_parquet('s3://{BUCKET}/{other.prefix_key}*.parquet')", "read_parquet"
    )
    world.refused("SELECT * FROM 's3://lake/dataset/x.parquet'", "s3://lake/dataset/x.parquet")


def test_attach(world: World) -> None:
    world.refused("ATTACH 'dbname=postgres' AS p (TYPE postgres)", "ATTACH")
    world.refused("DETACH taskplat_pg", "DETACH")


def test_copy(world: World, tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    world.refused(f"COPY alerts TO '{target}'", "COPY")
    world.refused(f"COPY (SELECT 1) TO '{target}' (FORMAT csv)", "COPY")
    assert not target.exists()


def test_set(world: World) -> None:
    world.refused("SET enable_external_access = true", "SET")
    world.refused("RESET lock_configuration", "SET")
    world.refused("USE taskplat_pg", "SET")


def test_pragma(world: World) -> None:
    world.refused("PRAGMA database_list", "statement not allowed")
    world.refused("SELECT * FROM pragma_database_list()", "pragma_database_list")


def test_install_and_load(world: World) -> None:
    world.refused("INSTALL httpfs", "LOAD")
    world.refused("LOAD postgres_scanner", "LOAD")
    world.refused("FORCE INSTALL spatial FROM community", "LOAD")


def test_table_functions(world: World) -> None:
    world.refused("SELECT * FROM duckdb_settings()", "duckdb_settings")
    world.refused("SELECT * FROM alerts, unnest([1, 2])", "unnest")
    world.refused("SELECT * FROM postgres_query('taskplat_pg', 'SELECT 1')", "postgres_query")


def test_more_than_one_statement(world: World) -> None:
    world.refused("SELECT 1; SELECT * FROM payroll", "one statement")
    world.refused("SELECT * FROM alerts; SELECT 2", "one statement")


def test_writes(world: World) -> None:
    world.refused("INSERT INTO alerts (block) VALUES (2)", "INSERT")
    world.refused("UPDATE alerts SET block = 2", "UPDATE")
    world.refused("DELETE FROM alerts", "DELETE")
    world.refused("CREATE TABLE t AS SELECT * FROM alerts", "CREATE")
    world.refused("DROP VIEW alerts", "DROP")
    world.refused("ALTER VIEW alerts RENAME TO a2", "ALTER")


ESCAPES: list[tuple[str, str]] = [
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ("SELECT * FROM read_csv_auto('/etc/passwd')", "read_csv_auto"),
    ("SELECT * FROM read_json_auto('/etc/passwd')", "read_json_auto"),
    ("SELECT * FROM read_blob('/etc/passwd')", "read_blob"),
    ("SELECT * FROM '/etc/passwd'", "/etc/passwd"),
    ("SELECT * FROM payroll", "payroll"),
    ("SELECT * FROM {other_uuid_view}", "{other_uuid_view}"),
    ("SELECT * FROM taskplat_pg.public.{other_table}", "taskplat_pg"),
    ("ATTACH 'postgres:dbname=postgres' AS p", "ATTACH"),
    ("ATTACH ':memory:' AS m", "ATTACH"),
    ("SET enable_external_access = true", "SET"),
    ("SET allowed_directories = ['/']", "SET"),
    ("COPY alerts TO '/tmp/escape.csv'", "COPY"),
    ("COPY alerts FROM '/etc/passwd'", "COPY"),
    ("SELECT * FROM alerts; SELECT * FROM payroll", "one statement"),
    ("WITH t AS (SELECT * FROM payroll) SELECT * FROM t", "payroll"),
    ("SELECT * FROM alerts WHERE block IN (SELECT salary FROM payroll)", "payroll"),
    ("SELECT (SELECT max(salary) FROM payroll) FROM alerts", "payroll"),
    ("SELECT block FROM alerts UNION ALL SELECT salary FROM payroll", "payroll"),
    ("SELECT * FROM alerts, LATERAL (SELECT * FROM payroll) p", "payroll"),
    ("WITH duckdb_tables AS (SELECT 1) SELECT * FROM duckdb_tables", "duckdb_tables"),
    ("SELECT * FROM read_parquet('s3://lake/{other_prefix}*')", "read_parquet"),
    ("SELECT * FROM read_parquet(['s3://lake/{other_prefix}part-0.parquet'])", "read_parquet"),
    ("SELECT * FROM pg_catalog.pg_class", "pg_catalog.pg_class"),
    ("SELECT * FROM pg_settings", "pg_settings"),
    ("SELECT * FROM information_schema.columns", "information_schema.columns"),
    ("SELECT * FROM sqlite_master", "sqlite_master"),
    ("SELECT * FROM duckdb_settings()", "duckdb_settings"),
    ("SELECT * FROM duckdb_secrets()", "duckdb_secrets"),
    ("SELECT * FROM duckdb_databases()", "duckdb_databases"),
    ("SELECT * FROM glob('/*')", "glob"),
    ("SELECT * FROM read_parquet('http://169.254.169.254/latest/meta-data')", "read_parquet"),
    ("SELECT * FROM 'https://example.com/data.parquet'", "https://example.com/data.parquet"),
    ("INSTALL httpfs", "LOAD"),
    ("LOAD json", "LOAD"),
    ("PRAGMA show_tables", "statement not allowed"),
    ("CREATE TABLE x (a INT)", "CREATE"),
    ("CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')", "CREATE"),
    ("INSERT INTO alerts VALUES (1, '00000000-0000-0000-0000-000000000000', 'k', 2)", "INSERT"),
    ("UPDATE alerts SET block = 0", "UPDATE"),
    ("DELETE FROM alerts", "DELETE"),
    ("EXPORT DATABASE '/tmp/escape'", "EXPORT"),
    ("CALL duckdb_secrets()", "CALL"),
    ("CHECKPOINT", "CALL"),
    ("PREPARE p AS SELECT * FROM payroll", "PREPARE"),
    ("EXPLAIN SELECT * FROM payroll", "EXPLAIN"),
    ("DESCRIBE alerts", "DESCRIBE"),
    ("SUMMARIZE payroll", "DESCRIBE"),
    ("BEGIN TRANSACTION", "TRANSACTION"),
    ("SELECT * FROM query('SELECT * FROM payroll')", "query"),
    ("SELECT * FROM query_table('payroll')", "query_table"),
    ("SELECT * FROM postgres_scan('dbname=postgres', 'public', 'tasks')", "postgres_scan"),
    ("SELECT current_setting('s3_secret_access_key')", "current_setting"),
    ("SELECT getvariable('x')", "getvariable"),
    ("SELECT pg_get_viewdef(1)", "pg_get_viewdef"),
    ("SELECT system.main.lower('a')", "system.main.lower"),
    ("SELECT * FROM memory.main.alerts", "memory.main.alerts"),
    ("SELECT * FROM temp.main.x", "temp.main.x"),
    ("SELECT * FROM (WITH payroll AS (SELECT 1 AS s) SELECT * FROM payroll) x, payroll", "payroll"),
    ("WITH a AS (SELECT * FROM payroll), payroll AS (SELECT 1) SELECT * FROM a", "payroll"),
    ("SELECT getenv('HOME')", "getenv"),
    ("SELECT nextval('s')", "nextval"),
]


@pytest.mark.parametrize(("sql", "named"), ESCAPES, ids=[s for s, _ in ESCAPES])
def test_escape_attempt_is_refused(world: World, sql: str, named: str) -> None:
    values = {
        "other_uuid_view": f"dataset_{world.other.dataset_uuid.hex}",
        "other_table": f'"{world.other.table}"',
        "other_prefix": world.other_s3.prefix_key,
    }
    world.refused(sql.format(**values), named.format(**values))
    assert not Path("/tmp/escape.csv").exists() and not Path("/tmp/escape").exists()


def test_the_escape_list_is_long_enough() -> None:
    assert len(ESCAPES) >= 60

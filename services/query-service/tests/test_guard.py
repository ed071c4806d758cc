"""The guard alone (no service): CTE names resolve by scope, every kind of node and every function
is allow-listed, and the SELECT shapes an operator needs pass."""

from __future__ import annotations

import pytest

from taskplat.query_service.functions import ALLOWED_FUNCTIONS
from taskplat.query_service.guard import InvalidSql, Refused, check

VIEWS = ["alerts", "prices"]

ALLOWED = [
    "SELECT severity, count(*) FROM alerts GROUP BY ALL HAVING count(*) > 1 ORDER BY 1 DESC "
    "NULLS LAST LIMIT 3 OFFSET 1",
    "SELECT DISTINCT ON (block) block FROM alerts",
    "SELECT * FROM alerts USING SAMPLE 10%",
    "SELECT * FROM (VALUES (1), (2)) v(x)",
    "SELECT row_number() OVER (PARTITION BY block ORDER BY severity) FROM alerts",
    "SELECT list_transform([block], x -> x + 1) FROM alerts",
    "SELECT block FROM alerts UNION SELECT block FROM prices EXCEPT SELECT 2",
    "SELECT CASE WHEN block IS NULL THEN 1 ELSE 2 END, block BETWEEN 1 AND 2, block::text, "
    "severity COLLATE nocase, coalesce(block, 1), block IN (1, 2), NOT (block = 1) FROM alerts",
    "SELECT * FROM alerts a JOIN prices p USING (block) LEFT JOIN prices q ON q.block = a.block",
    "SELECT * FROM alerts QUALIFY row_number() OVER () = 1",
    "SELECT ?, $1 FROM alerts",
    "SELECT * EXCLUDE (block) FROM alerts",
    "FROM alerts SELECT block",
    "SELECT * FROM alerts, LATERAL (SELECT block) s",
    "SELECT unnest([block]) FROM alerts",
    "SELECT EXISTS (SELECT 1 FROM prices)",
    "SELECT {'k': 1}['k'], [1, 2][1], 'a' LIKE 'b', 'a' GLOB 'b', date '2020-01-01' + 1, "
    "now() - interval 1 day, current_date",
    "SELECT max(block) FILTER (WHERE block > 1), string_agg(severity, ',' ORDER BY severity) "
    "FROM alerts",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    "WITH a AS (SELECT * FROM alerts), b AS (SELECT * FROM a) SELECT * FROM b "
    "WHERE block IN (SELECT block FROM a)",
    "WITH a AS MATERIALIZED (SELECT 1 AS x) SELECT * FROM a",
    "SELECT (WITH c AS (SELECT 1 AS x) SELECT x FROM c) FROM alerts",
    "SELECT 1.5::DECIMAL(10, 2), 'nan'::DOUBLE, [1.5, 2]::DOUBLE[], {'a': 1}::STRUCT(a INT)",
]


@pytest.mark.parametrize("sql", ALLOWED)
def test_the_shapes_an_operator_needs_pass(sql: str) -> None:
    check(sql, VIEWS)


OUT_OF_SCOPE = [
    # A CTE of a subquery is not in scope outside it.
    "SELECT * FROM (WITH payroll AS (SELECT 1 AS s) SELECT * FROM payroll) x, payroll",
    "SELECT * FROM alerts WHERE block IN (WITH payroll AS (SELECT 1) SELECT * FROM payroll) "
    "AND block IN (SELECT salary FROM payroll)",
    "SELECT (WITH payroll AS (SELECT 1) SELECT 1 FROM payroll), (SELECT 1 FROM payroll)",
    # A CTE is not in scope in an earlier CTE, nor (not recursive) in itself.
    "WITH a AS (SELECT * FROM payroll), payroll AS (SELECT 1) SELECT * FROM a",
    "WITH payroll AS (SELECT * FROM payroll) SELECT * FROM payroll",
    # A CTE of one side of a UNION is not in scope on the other.
    "SELECT * FROM (WITH payroll AS (SELECT 1) SELECT * FROM payroll) "
    "UNION ALL SELECT * FROM payroll",
]


@pytest.mark.parametrize("sql", OUT_OF_SCOPE)
def test_a_cte_name_out_of_its_scope_is_refused(sql: str) -> None:
    with pytest.raises(Refused, match="payroll"):
        check(sql, VIEWS)


@pytest.mark.parametrize(
    "function",
    [
        "getenv('HOME')",
        "nextval('s')",
        "current_setting('threads')",
        "version()",
        "json_execute_serialized_sql('')",
        "current_schema()",
        "which_secret('s3://x', 's3')",
        "error('x')",
        "system.main.lower('a')",
    ],
)
def test_a_function_not_on_the_list_is_refused(function: str) -> None:
    with pytest.raises(Refused, match="function"):
        check(f"SELECT {function} FROM alerts", VIEWS)


def test_nothing_that_reads_the_engine_is_listed() -> None:
    prefixes = ("pg_", "duckdb_", "read_", "current_s", "get", "set", "json_execute", "which")
    assert not [
        name
        for name in ALLOWED_FUNCTIONS
        if name.startswith(prefixes)
        and name not in ("get_bit", "set_bit", "get_current_time", "get_current_timestamp")
    ]


# The SQL reaches DuckDB's serializer inside a string literal: quotes in it cannot end that
# literal and smuggle a statement of their own past the guard.
QUOTED_ESCAPES: list[tuple[str, type[Exception], str]] = [
    ("SELECT 1 AS x') ; ATTACH ':memory:' AS m; SELECT ('", InvalidSql, "does not parse"),
    ("SELECT 'x'); ATTACH ':memory:' AS m; SELECT ('y'", InvalidSql, "does not parse"),
    ("SELECT ''';'; ATTACH ':memory:' AS m", Refused, "one statement"),
    ("SELECT 1') , (SELECT * FROM payroll) --", InvalidSql, "does not parse"),
    ("'); COPY alerts TO '/tmp/escape.csv'; --", InvalidSql, "does not parse"),
    ("SELECT 'a\x00'); ATTACH ':memory:' AS m; --", InvalidSql, "NUL"),
]


@pytest.mark.parametrize(("sql", "error", "named"), QUOTED_ESCAPES)
def test_quotes_in_the_sql_cannot_end_the_literal_it_is_serialized_in(
    sql: str, error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        check(sql, VIEWS)


def test_quotes_inside_a_select_are_kept_as_written() -> None:
    checked = check("SELECT 'it''s', $$a'b$$, E'\\'' FROM alerts", VIEWS)
    assert checked.views == {"alerts"}

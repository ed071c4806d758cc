"""The statement guard: what a query may reference, decided from DuckDB's own parser.

Invariants:
  * A query is exactly one statement, and that statement is a `SELECT`: DuckDB's
    `json_serialize_sql` serializes nothing else. When it cannot serialize the SQL, DuckDB's
    `extract_statements` names why: anything else (`COPY`, `ATTACH`, `SET`, `PRAGMA`, `INSTALL`,
    `LOAD`, `CALL`, `EXPORT`, a write, DDL, a second statement) is `Refused`, naming what it is.
    The SQL reaches `json_serialize_sql` as a string literal, its quotes doubled (so it cannot end
    the literal), and never with a NUL character (`InvalidSql`): a bound parameter cost each
    sandbox ~0.6 ms more, a prepared statement's first use in a fresh process.
  * The parsed tree (`json_serialize_sql`) is walked whole, and everything in it is allow-listed:
    query nodes, table references (joins, subqueries, VALUES, PIVOT and base tables), result
    modifiers and expression classes of a plain SELECT; anything else (a table function such as
    `read_csv`, `glob`, `duckdb_settings` or a `PRAGMA`'s rewrite, `DESCRIBE`/`SHOW`, a kind of
    node a newer DuckDB adds) is refused.
  * Every base table must be an input view (unqualified) or a CTE in scope where it is named: a
    query node's CTEs are in scope in its body, in its later CTEs (a recursive one in itself too)
    and in the subqueries inside them, nowhere else. No CTE may take the name of one of DuckDB's
    own catalog views (so it cannot stand in for one).
  * Every function (scalar, aggregate, window, operator) must be on `functions.ALLOWED_FUNCTIONS`
    and name no catalog or schema.
  * Nothing here runs the statement: the guard parses only, on a DuckDB connection holding no
    data. The service calls it inside the query's sandbox (`sandbox.py`), before any input is
    read or handed over, so DuckDB's parser never sees untrusted SQL in the service's process.
  * Unparseable SQL is `InvalidSql` (400), never a refusal that names the wrong thing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import duckdb

from taskplat.common.errors import BadRequest, Forbidden
from taskplat.query_service.functions import ALLOWED_FUNCTIONS

# Query nodes a SELECT may be made of.
QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
# Table references that reach no data by themselves (their children are walked); BASE_TABLE is
# checked against the views and the CTEs in scope.
SAFE_TABLE_REFS = frozenset({"JOIN", "SUBQUERY", "EMPTY", "EXPRESSION_LIST", "PIVOT"})
# The other typed parts of a SELECT's tree: result modifiers and ORDER BY directions.
SAFE_PARTS = frozenset(
    {
        "ORDER_MODIFIER",
        "LIMIT_MODIFIER",
        "LIMIT_PERCENT_MODIFIER",
        "DISTINCT_MODIFIER",
        "ASCENDING",
        "DESCENDING",
        "ORDER_DEFAULT",
    }
)
ALLOWED_TYPES = QUERY_NODES | SAFE_TABLE_REFS | SAFE_PARTS | {"BASE_TABLE"}
# Expression classes; a FUNCTION or WINDOW must also name a function of the allow-list.
ALLOWED_CLASSES = frozenset(
    {
        "BETWEEN",
        "CASE",
        "CAST",
        "COLLATE",
        "COLUMN_REF",
        "COMPARISON",
        "CONJUNCTION",
        "CONSTANT",
        "FUNCTION",
        "LAMBDA",
        "OPERATOR",
        "PARAMETER",
        "POSITIONAL_REFERENCE",
        "STAR",
        "SUBQUERY",
        "WINDOW",
    }
)
# Keys of logical types (a cast's target, a constant's type): descriptions, not walked.
TYPE_KEYS = frozenset({"type", "type_info", "cast_type"})
# How refused table references are named.
REFUSED_TABLE_REFS = {
    "SHOW_REF": "DESCRIBE/SHOW/SUMMARIZE",
    "COLUMN_DATA": "materialized data",
    "DELIM_GET": "internal reference",
}


class InvalidSql(BadRequest):
    code = "invalid_sql"


class Refused(Forbidden):
    """The statement references something that is not one of the token's inputs."""

    code = "refused"


@dataclass(frozen=True)
class Checked:
    """A statement that passed: the views it reads (lower-case names)."""

    sql: str
    views: frozenset[str]


_parser = threading.local()


def _parse_connection() -> duckdb.DuckDBPyConnection:
    conn: duckdb.DuckDBPyConnection | None = getattr(_parser, "conn", None)
    if conn is None:
        conn = duckdb.connect(":memory:", config={"enable_external_access": False})
        _parser.conn = conn
    return conn


_catalog_names: frozenset[str] | None = None


def system_names(conn: duckdb.DuckDBPyConnection | None = None) -> frozenset[str]:
    """The names DuckDB resolves without any data attached (its catalog views and tables); read
    once per process, on `conn` (one holding no data) or this thread's parse connection."""
    global _catalog_names
    if _catalog_names is None:
        rows = (
            (conn or _parse_connection())
            .execute(
                "SELECT lower(view_name) FROM duckdb_views() "
                "UNION SELECT lower(table_name) FROM duckdb_tables() "
                "UNION SELECT lower(schema_name) FROM duckdb_schemas()"
            )
            .fetchall()
        )
        _catalog_names = frozenset(str(row[0]) for row in rows)
    return _catalog_names


def _statement_kind(value: object) -> str:
    return str(value).rsplit(".", 1)[-1].upper()


def check(sql: str, views: Iterable[str], conn: duckdb.DuckDBPyConnection | None = None) -> Checked:
    """`sql` if it may run against exactly `views`; else `Refused` (403) or `InvalidSql` (400).
    `conn` parses (a sandbox's own, locked-down DuckDB, before it holds any data); by default a
    connection of this thread that holds no data."""
    allowed = frozenset(v.lower() for v in views)
    conn = conn or _parse_connection()
    if "\x00" in sql:
        raise InvalidSql("the SQL does not parse: it holds a NUL character")
    tree = _serialized(sql, conn)
    if tree.get("error") or len(tree["statements"]) != 1:
        _refuse_by_statements(sql, conn)  # what it is, if it is not one SELECT
        if tree.get("error"):
            # A SELECT that DuckDB rewrites from another statement (PRAGMA) does not serialize.
            message = tree.get("error_message", "not a plain SELECT")
            raise Refused(f"statement not allowed: {message}")
        raise Refused(f"one statement per query: found {len(tree['statements'])}")
    _no_shadowing(tree)
    walker = _Walker(allowed)
    walker.walk(tree["statements"][0], frozenset())
    return Checked(sql, frozenset(walker.read))


def _serialized(sql: str, conn: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """DuckDB's parse tree of `sql` (NUL-free), or its error, as `json_serialize_sql` gives it."""
    literal = "'" + sql.replace("'", "''") + "'"  # quotes doubled: nothing ends the literal
    row = conn.execute(f"SELECT json_serialize_sql({literal})").fetchone()
    assert row is not None
    tree: dict[str, Any] = json.loads(row[0])
    return tree


def _refuse_by_statements(sql: str, conn: duckdb.DuckDBPyConnection) -> None:
    """`InvalidSql` or `Refused` naming why `sql` is not one SELECT, by DuckDB's own split of
    it into statements; returns when it is one."""
    try:
        statements = conn.extract_statements(sql)
    except duckdb.Error as exc:
        raise InvalidSql(f"the SQL does not parse: {_first_line(exc)}") from None
    if not statements:
        raise InvalidSql("the SQL holds no statement")
    if len(statements) > 1:
        raise Refused(f"one statement per query: found {len(statements)}")
    kind = _statement_kind(statements[0].type)
    if kind != "SELECT":
        raise Refused(f"{kind} statements are not allowed: only one SELECT")


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:300]


def _no_shadowing(tree: Any) -> None:
    """No CTE anywhere in the statement may take the name of one of DuckDB's own catalog names."""
    names: set[str] = set()
    pending = [tree]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            for entry in (item.get("cte_map") or {}).get("map") or []:
                names.add(str(entry["key"]).lower())
            if isinstance(item.get("cte_name"), str):
                names.add(item["cte_name"].lower())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    shadowing = sorted(names & system_names())
    if shadowing:
        raise Refused(f"a CTE may not be named like a catalog view: {', '.join(shadowing)}")


class _Walker:
    """Walks the tree with the CTE names in scope at each point: a query node's CTEs are in
    scope in its body and in the CTEs defined after them (a recursive CTE also in itself), and
    in every subquery inside those, nowhere else."""

    def __init__(self, views: frozenset[str]) -> None:
        self._views = views
        self.read: set[str] = set()

    def walk(self, item: Any, scope: frozenset[str]) -> None:
        if isinstance(item, list):
            for value in item:
                self.walk(value, scope)
            return
        if not isinstance(item, dict):
            return
        if "class" in item:
            self._expression(item)
        else:
            self._part(item)
        entries = (item.get("cte_map") or {}).get("map") or []
        inner = scope
        for entry in entries:
            name = str(entry["key"]).lower()
            query = (entry.get("value") or {}).get("query") or {}
            recursive = (query.get("node") or {}).get("type") == "RECURSIVE_CTE_NODE"
            self.walk(entry.get("value"), inner | {name} if recursive else inner)
            inner = inner | {name}
        for key, value in item.items():
            if key != "cte_map" and not (key in TYPE_KEYS and isinstance(value, dict)):
                self.walk(value, inner)
        if item.get("type") == "BASE_TABLE":
            self._table(item, inner)

    def _part(self, node: dict[str, Any]) -> None:
        kind = node.get("type")
        if not isinstance(kind, str) or kind in ALLOWED_TYPES:
            return
        if kind == "TABLE_FUNCTION":
            name = _function_name(node.get("function") or {})
            raise Refused(f"table function {name} is not allowed: read the input views")
        if kind in REFUSED_TABLE_REFS:
            raise Refused(f"{REFUSED_TABLE_REFS[kind]} is not allowed")
        raise Refused(f"{kind.removesuffix('_NODE').replace('_', ' ')} is not allowed")

    def _table(self, node: dict[str, Any], scope: frozenset[str]) -> None:
        name = str(node.get("table_name", ""))
        qualifier = [p for p in (node.get("catalog_name"), node.get("schema_name")) if p]
        full = ".".join([*map(str, qualifier), name])
        if qualifier:
            raise Refused(f"table {full} is not an input of this task: use an input view name")
        lowered = name.lower()
        if lowered in scope:
            return
        if lowered not in self._views:
            raise Refused(f"table {full} is not an input of this task")
        self.read.add(lowered)

    def _expression(self, node: dict[str, Any]) -> None:
        kind = str(node["class"])
        if kind not in ALLOWED_CLASSES:
            raise Refused(f"expression {kind.lower().replace('_', ' ')} is not allowed")
        if kind not in ("FUNCTION", "WINDOW"):
            return
        name = str(node.get("function_name", "")).lower()
        catalog, schema = node.get("catalog") or "", node.get("schema") or ""
        if catalog or schema not in ("", "main"):
            raise Refused(f"function {_function_name(node)} is not allowed")
        if name not in ALLOWED_FUNCTIONS:
            raise Refused(f"function {name} is not allowed")


def _function_name(node: dict[str, Any]) -> str:
    parts = [node.get("catalog") or "", node.get("schema") or "", node.get("function_name", "?")]
    return ".".join(str(p) for p in parts if p)

"""The statement guard: what a query may reference, decided from DuckDB's own parser.

Invariants:
  * A query is exactly one statement, and that statement is a `SELECT` (DuckDB's
    `extract_statements`); anything else (`COPY`, `ATTACH`, `SET`, `PRAGMA`, `INSTALL`, `LOAD`,
    `CALL`, `EXPORT`, a write, DDL, a second statement) is `Refused`, naming what it is.
  * The parsed tree (`json_serialize_sql`) is walked whole: every base table must be an attached
    view (unqualified) or a CTE of the statement; a CTE may not take the name of one of DuckDB's
    own catalog views (so it cannot stand in for one); table functions (`read_csv`, `glob`,
    `duckdb_settings`, `postgres_query`, a `PRAGMA`'s rewrite...) and `DESCRIBE`/`SHOW` are
    refused; scalar functions that read the engine's state (`current_setting`, `getvariable`,
    `pg_*`, `duckdb_*`, `current_*`, `write_log`...) or name a catalog or schema are refused.
  * Nothing here runs the statement: the guard parses only, on a DuckDB connection holding no
    data, before the query's own connection is even opened.
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

# Query nodes a SELECT may be made of.
QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
# Table references that reach no data by themselves (their children are walked).
SAFE_TABLE_REFS = frozenset({"JOIN", "SUBQUERY", "EMPTY", "EXPRESSION_LIST", "PIVOT"})
# Table references refused outright, with what to call them.
REFUSED_TABLE_REFS = {
    "TABLE_FUNCTION": "table function",
    "SHOW_REF": "DESCRIBE/SHOW/SUMMARIZE",
    "COLUMN_DATA": "materialized data",
    "DELIM_GET": "internal reference",
}
# Scalar functions (and macros) that read or change the engine's own state.
REFUSED_FUNCTION_PREFIXES = ("pg_", "duckdb_", "current_", "has_", "txid_", "json_execute")
REFUSED_FUNCTIONS = frozenset(
    {
        "getvariable",
        "getenv",
        "write_log",
        "parse_duckdb_log_message",
        "which_secret",
        "version",
        "json_serialize_sql",
        "json_deserialize_sql",
        "json_serialize_plan",
        "map_to_pg_oid",
        "format_pg_type",
        "current_setting",
        "set_config",
    }
)
# Harmless names under a refused prefix.
ALLOWED_FUNCTIONS = frozenset(
    {
        "current_date",
        "current_time",
        "current_timestamp",
        "current_localtime",
        "current_localtimestamp",
    }
)


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


def _system_names() -> frozenset[str]:
    """The names DuckDB resolves without any data attached (its catalog views and tables)."""
    global _catalog_names
    if _catalog_names is None:
        rows = (
            _parse_connection()
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


def check(sql: str, views: Iterable[str]) -> Checked:
    """`sql` if it may run against exactly `views`; else `Refused` (403) or `InvalidSql` (400)."""
    allowed = frozenset(v.lower() for v in views)
    conn = _parse_connection()
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
    tree = json.loads(conn.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])  # type: ignore[index]
    if tree.get("error"):
        # A SELECT that DuckDB rewrites from another statement (PRAGMA) does not serialize.
        raise Refused(f"statement not allowed: {tree.get('error_message', 'not a plain SELECT')}")
    if len(tree["statements"]) != 1:
        raise Refused(f"one statement per query: found {len(tree['statements'])}")
    walker = _Walker(allowed, _ctes(tree))
    walker.walk(tree["statements"][0])
    return Checked(sql, frozenset(walker.read))


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:300]


def _ctes(tree: Any) -> frozenset[str]:
    """Every CTE name the statement defines; none may shadow one of DuckDB's own names."""
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
    shadowing = sorted(names & _system_names())
    if shadowing:
        raise Refused(f"a CTE may not be named like a catalog view: {', '.join(shadowing)}")
    return frozenset(names)


class _Walker:
    def __init__(self, views: frozenset[str], ctes: frozenset[str]) -> None:
        self._views = views
        self._ctes = ctes
        self.read: set[str] = set()

    def walk(self, root: Any) -> None:
        pending = [root]
        while pending:
            item = pending.pop()
            if isinstance(item, list):
                pending.extend(item)
            elif isinstance(item, dict):
                self._node(item)
                pending.extend(item.values())

    def _node(self, node: dict[str, Any]) -> None:
        kind = node.get("type")
        if "class" in node:
            if node["class"] == "FUNCTION":
                self._function(node)
            return
        if not isinstance(kind, str):
            return
        if kind.endswith("_NODE") and kind not in QUERY_NODES:
            raise Refused(f"{kind.removesuffix('_NODE').replace('_', ' ')} is not allowed")
        if kind in REFUSED_TABLE_REFS:
            what = REFUSED_TABLE_REFS[kind]
            if kind == "TABLE_FUNCTION":
                name = _function_name(node.get("function") or {})
                raise Refused(f"table function {name} is not allowed: read the input views")
            raise Refused(f"{what} is not allowed")
        if kind == "BASE_TABLE":
            self._table(node)

    def _table(self, node: dict[str, Any]) -> None:
        name = str(node.get("table_name", ""))
        qualifier = [p for p in (node.get("catalog_name"), node.get("schema_name")) if p]
        full = ".".join([*map(str, qualifier), name])
        if qualifier:
            raise Refused(f"table {full} is not an input of this task: use an input view name")
        lowered = name.lower()
        if lowered in self._ctes:
            return
        if lowered not in self._views:
            raise Refused(f"table {full} is not an input of this task")
        self.read.add(lowered)

    def _function(self, node: dict[str, Any]) -> None:
        name = str(node.get("function_name", "")).lower()
        catalog, schema = node.get("catalog") or "", node.get("schema") or ""
        if catalog or schema not in ("", "main"):
            raise Refused(f"function {_function_name(node)} is not allowed")
        if name in ALLOWED_FUNCTIONS:
            return
        if name in REFUSED_FUNCTIONS or name.startswith(REFUSED_FUNCTION_PREFIXES):
            raise Refused(f"function {name} is not allowed")


def _function_name(node: dict[str, Any]) -> str:
    parts = [node.get("catalog") or "", node.get("schema") or "", node.get("function_name", "?")]
    return ".".join(str(p) for p in parts if p)

"""Buffered Postgres datasets: declared schemas, their hash, queue names, and the checks
of a buffered record. Pure functions, no I/O; shared by the dispatcher (apply) and the sink
(writes).

Invariants:
  * a column name matches `^[a-z_][a-z0-9_]{0,62}$` and is not reserved (`row_id`, or a name
    starting with `pg_`); a type is one of `TYPES` (aliases such as `int8` or
    `timestamp with time zone` are folded into their canonical name). Anything else is a
    problem, never reaches SQL;
  * `org_id uuid` and `dedupe_key text` are always the first two columns; declaring them again is
    allowed only with those types;
  * the schema hash is `sha256:` + hex of the canonical JSON of the full column list, so the same
    schema hashes the same whatever the aliases used;
  * a record is accepted only when it is a JSON object whose keys are columns of the schema, with
    `org_id` a UUID, `dedupe_key` a non-empty string, and each value of its column's type (or
    null); a text never contains NUL (Postgres cannot store it).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any
from uuid import UUID

TYPES = (
    "text",
    "bigint",
    "integer",
    "smallint",
    "boolean",
    "double precision",
    "real",
    "numeric",
    "jsonb",
    "uuid",
    "timestamptz",
    "date",
)
ALIASES = {
    "int": "integer",
    "int4": "integer",
    "int8": "bigint",
    "int2": "smallint",
    "bool": "boolean",
    "float8": "double precision",
    "float4": "real",
    "decimal": "numeric",
    "timestamp with time zone": "timestamptz",
    "varchar": "text",
}
FIXED = (("org_id", "uuid"), ("dedupe_key", "text"))
RESERVED = frozenset({"row_id"})
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_INT_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}
MAX_DEDUPE_KEY = 1024


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str


class SchemaProblem(ValueError):
    """A declared column the platform refuses; `index` is its position in the declaration."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.field = field
        self.message = message


def canonical_type(declared: str) -> str | None:
    folded = " ".join(declared.lower().split())
    folded = ALIASES.get(folded, folded)
    return folded if folded in TYPES else None


def full_schema(declared: list[tuple[str, str]]) -> list[Column]:
    """The dataset's columns: org_id, dedupe_key, then the declared ones, canonical. Raises
    SchemaProblem for the first name or type outside the allow-list (or given twice)."""
    columns = [Column(name, kind) for name, kind in FIXED]
    seen = {name: kind for name, kind in FIXED}
    for index, (name, declared_type) in enumerate(declared):
        if not _NAME.match(name) or name in RESERVED or name.startswith("pg_"):
            raise SchemaProblem(
                index,
                "name",
                f"column name {name!r} is not allowed (lower-case letters, digits and '_', "
                "at most 63, not row_id or pg_*)",
            )
        kind = canonical_type(declared_type)
        if kind is None:
            raise SchemaProblem(
                index,
                "type",
                f"column type {declared_type!r} is not allowed (one of: {', '.join(TYPES)})",
            )
        if name in seen:
            if dict(FIXED).get(name) == kind and name not in {c.name for c in columns[2:]}:
                continue
            raise SchemaProblem(index, "name", f"column {name!r} is declared twice or retyped")
        seen[name] = kind
        columns.append(Column(name, kind))
    return columns


def schema_hash(columns: list[Column]) -> str:
    canonical = json.dumps(
        [{"name": c.name, "type": c.type} for c in columns], separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def buffer_queue_names(prefix: str, dataset_uuid: UUID) -> tuple[str, str]:
    """The buffer queue and its DLQ: `<prefix>buffer-<uuid hex>` and `...-dlq`."""
    name = f"{prefix}buffer-{dataset_uuid.hex}"
    return name, f"{name}-dlq"


class BadRecord(ValueError):
    pass


def _check_text(value: Any) -> str:
    if not isinstance(value, str):
        raise BadRecord("not a string")
    if "\x00" in value:
        raise BadRecord("contains NUL")
    return value


def _check_value(kind: str, value: Any) -> None:
    if kind == "text":
        _check_text(value)
    elif kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise BadRecord(f"not a {kind}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise BadRecord("not a boolean")
    elif kind in ("double precision", "real", "numeric"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRecord(f"not a {kind}")
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRecord("not finite")
    elif kind == "jsonb":
        if "\\u0000" in json.dumps(value):
            raise BadRecord("contains NUL")
    elif kind == "uuid":
        try:
            UUID(_check_text(value))
        except ValueError:
            raise BadRecord("not a UUID") from None
    elif kind == "timestamptz":
        try:
            parsed = datetime.fromisoformat(_check_text(value))
        except ValueError:
            raise BadRecord("not an ISO 8601 timestamp") from None
        if parsed.tzinfo is None:
            raise BadRecord("a timestamp needs a UTC offset")
    elif kind == "date":
        try:
            date.fromisoformat(_check_text(value))
        except ValueError:
            raise BadRecord("not an ISO 8601 date") from None


def check_record(columns: list[Column], record: Any) -> None:
    """Raise BadRecord naming why `record` cannot be written to a table of `columns`."""
    if not isinstance(record, dict):
        raise BadRecord("a record is a JSON object")
    types = {c.name: c.type for c in columns}
    unknown = sorted(set(record) - set(types))
    if unknown:
        raise BadRecord(f"unknown column {unknown[0]!r}")
    dedupe_key = record.get("dedupe_key")
    if not isinstance(dedupe_key, str) or not dedupe_key or len(dedupe_key) > MAX_DEDUPE_KEY:
        raise BadRecord(f"dedupe_key must be a string of 1-{MAX_DEDUPE_KEY} characters")
    if record.get("org_id") is None:
        raise BadRecord("org_id is required")
    for name, value in record.items():
        if value is None:
            continue
        try:
            _check_value(types[name], value)
        except BadRecord as exc:
            raise BadRecord(f"column {name!r}: {exc}") from None

"""Load named SQL queries from `.sql` files that sit beside the code running them.

A file holds blocks that each start with a `-- name: <identifier>` line. Invariants: queries are
loaded once at import time into an immutable mapping; a duplicate or empty name is an error at load
time, so a typo fails at start-up, never mid-request. Queries are literal SQL; parameters are bound
by psycopg.
"""

from __future__ import annotations

import re
from importlib import resources
from types import MappingProxyType
from typing import LiteralString, cast

_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str, *, source: str = "<sql>") -> MappingProxyType[str, LiteralString]:
    """Split `text` into named queries."""
    matches = list(_NAME_LINE.finditer(text))
    if not matches:
        raise ValueError(f"{source}: no '-- name:' blocks")
    queries: dict[str, LiteralString] = {}
    for index, match in enumerate(matches):
        name = match.group(1)
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        if not body:
            raise ValueError(f"{source}: query {name!r} is empty")
        if name in queries:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        queries[name] = cast(LiteralString, body)  # type: ignore[redundant-cast]
    return MappingProxyType(queries)


def load_queries(package: str, filename: str) -> MappingProxyType[str, LiteralString]:
    """Load the named queries of `filename` shipped inside `package`."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return parse_queries(text, source=f"{package}/{filename}")

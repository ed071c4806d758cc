"""Every query of the dispatcher fits psycopg's query cache: a longer one would be parsed again,
in Python, on every execution (the hot completion statement is the one near the limit)."""

from __future__ import annotations

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from taskplat.common.db.queries import load_queries


@pytest.mark.parametrize("file", ["tasks.sql", "batch.sql"])
def test_every_query_fits_psycopgs_query_cache(file: str) -> None:
    queries = load_queries("taskplat.dispatcher.repository", file)
    too_long = {
        name: len(text.encode())
        for name, text in queries.items()
        if len(text.encode()) > MAX_CACHED_STATEMENT_LENGTH
    }
    assert too_long == {}

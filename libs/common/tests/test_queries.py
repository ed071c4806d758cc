"""The named-query loader: `-- name:` blocks become an immutable mapping; duplicate, empty or
missing names fail at load time."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from taskplat.common.db.queries import load_queries, parse_queries

TWO_QUERIES = """\
-- A file comment before the first block is not a query.

-- name: first_query
-- A comment inside a query stays part of it.
SELECT 1
FROM tasks
WHERE task_id = %(task_id)s

-- name: second
UPDATE tasks SET status = 'Queued' WHERE task_id = %(task_id)s RETURNING task_id;
"""


def test_blocks_become_named_queries() -> None:
    queries = parse_queries(TWO_QUERIES)
    assert list(queries) == ["first_query", "second"]
    assert queries["first_query"] == (
        "-- A comment inside a query stays part of it.\n"
        "SELECT 1\nFROM tasks\nWHERE task_id = %(task_id)s"
    )
    assert queries["second"].startswith("UPDATE tasks") and queries["second"].endswith(";")
    with pytest.raises(TypeError):
        queries["third"] = "SELECT 3"  # type: ignore[index]


def test_name_line_spacing_is_flexible_but_names_are_identifiers() -> None:
    assert list(parse_queries("--name:a\nSELECT 1\n--   name:   b_2  \nSELECT 2")) == ["a", "b_2"]
    # A line that is not a valid name line is SQL, not a new block.
    queries = parse_queries("-- name: a\nSELECT 1\n-- name: Bad-Name\nSELECT 2")
    assert list(queries) == ["a"]
    assert "Bad-Name" in queries["a"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "'a' is defined twice"),
        ("-- name: a\n\n-- name: b\nSELECT 2\n", "'a' is empty"),
        ("-- name: a\nSELECT 1\n-- name: b\n   \n", "'b' is empty"),
        ("SELECT 1\n", "no '-- name:' blocks"),
        ("", "no '-- name:' blocks"),
    ],
)
def test_duplicate_empty_or_missing_names_are_rejected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        parse_queries(text, source="pkg/file.sql")
    assert "pkg/file.sql" in str(raised.value)


def test_load_queries_reads_a_file_shipped_in_a_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = f"queries_fixture_{uuid.uuid4().hex}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "things.sql").write_text(TWO_QUERIES)
    (tmp_path / package / "twice.sql").write_text("-- name: x\nSELECT 1\n-- name: x\nSELECT 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        queries = load_queries(package, "things.sql")
        assert list(queries) == ["first_query", "second"]
        with pytest.raises(ValueError, match=f"{package}/twice.sql: query 'x' is defined twice"):
            load_queries(package, "twice.sql")
        with pytest.raises(FileNotFoundError):
            load_queries(package, "missing.sql")
    finally:
        sys.modules.pop(package, None)

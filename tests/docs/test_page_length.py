"""Every page stays readable: no page of docs/ over 600 lines, and README.md at most 250."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_PAGE_LINES = 600
MAX_README_LINES = 250


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_docs_page_is_over_600_lines() -> None:
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert pages
    long = {str(p.relative_to(ROOT)): _lines(p) for p in pages if _lines(p) > MAX_PAGE_LINES}
    assert not long, f"split these pages (at most {MAX_PAGE_LINES} lines each): {long}"


def test_readme_is_at_most_250_lines() -> None:
    assert _lines(ROOT / "README.md") <= MAX_README_LINES

"""README.md is the front door: it names the commands a newcomer needs and stays short.

The settings and the routes it once listed are generated into the site's reference from the code
(tools/docs_site/hooks.py; tests/docs/test_site.py builds it).
"""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_commands_a_newcomer_needs_are_named() -> None:
    text = README.read_text(encoding="utf-8")
    for command in ("make up", "make test", "make demo", "make bench", "make docs"):
        assert command in text, command

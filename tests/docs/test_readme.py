"""README.md lists every setting of every service with its default, as the code defines them."""

from __future__ import annotations

import os
from pathlib import Path

from settings_table import BEGIN, END, settings_section

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_every_setting_with_its_default() -> None:
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "README.md lacks the settings section markers"
    start, end = text.index(BEGIN), text.index(END) + len(END)
    expected = settings_section()
    if os.environ.get("TASKPLAT_UPDATE_SNAPSHOTS") == "1":
        README.write_text(text[:start] + expected + text[end:], encoding="utf-8")
        return
    assert text[start:end] == expected, (
        "README.md's settings tables are out of date: run "
        "TASKPLAT_UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/docs"
    )


def test_the_commands_a_newcomer_needs_are_named() -> None:
    text = README.read_text(encoding="utf-8")
    for command in ("make up", "make test", "make demo", "make bench"):
        assert command in text, command


def test_readme_lists_every_route_of_the_dispatcher() -> None:
    from taskplat.dispatcher.route_table import ALL_ROUTES

    text = README.read_text(encoding="utf-8")
    missing = []
    for spec in ALL_ROUTES:
        # A route is listed as `METHOD /path` or, for a sibling of the previous one, `/suffix`.
        listed = f"{spec.method} {spec.path}" in text or (
            f"`/{spec.path.rsplit('/', 1)[1]}`" in text and spec.path.rsplit("/", 1)[0] in text
        )
        if not listed:
            missing.append(f"{spec.method} {spec.path}")
    assert not missing, f"README.md does not list these dispatcher routes: {missing}"

"""docs/security.md's threat model backs each claim with a test: every `path::test_name` it names
(and every bare `test_name` that follows one, in the same cell) is a test function of that file.
A path given by its file name alone is the full path cited elsewhere in the section."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECURITY = REPO / "docs" / "security.md"
CITED = re.compile(r"`([\w./-]+\.py)::(test_\w+)`|`(test_\w+)`")


def _threat_model() -> str:
    text = SECURITY.read_text(encoding="utf-8")
    start = text.index("## Threat model")
    return text[start : text.index("\n## ", start + 1)]


def test_every_test_the_threat_model_names_exists() -> None:
    cited: list[tuple[str, str]] = []
    for line in _threat_model().splitlines():
        for cell in line.split("|"):
            path: str | None = None
            for match in CITED.finditer(cell):
                if match.group(1):
                    path = match.group(1)
                    cited.append((path, match.group(2)))
                elif path is not None:
                    cited.append((path, match.group(3)))
    assert len(cited) >= 30, cited
    full = {Path(path).name: path for path, _ in cited if "/" in path}
    missing = []
    for path, name in cited:
        file = REPO / full.get(path, path)
        source = file.read_text(encoding="utf-8") if file.is_file() else ""
        if not re.search(rf"^(async )?def {name}\(", source, re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert missing == [], f"docs/security.md names tests that do not exist: {missing}"

"""The operators the tutorials' test stack runs are the ones the tutorials tell a reader to add.

tests/docs/tutorials_plugin.py starts its stack with `TUTORIAL_OPERATORS` before any tutorial
runs, so it cannot take them from the pages; this checks that each entry, as a reader's
operators.yaml would spell it (name, then its `command` as a flow sequence), is written in one of
the tutorials, so the two cannot drift apart unseen.
"""

from __future__ import annotations

import json

from tutorials_plugin import TUTORIAL_OPERATORS, TUTORIALS


def test_every_operator_of_the_test_stack_is_the_one_a_tutorial_shows() -> None:
    pages = "\n".join(p.read_text(encoding="utf-8") for p in sorted(TUTORIALS.glob("*.md")))
    missing = []
    for name, spec in TUTORIAL_OPERATORS.items():
        entry = f"  {name}:\n    command: {json.dumps(spec['command'])}\n    mode: {spec['mode']}"
        if entry not in pages:
            missing.append(entry)
    assert not missing, "no tutorial shows these operators.yaml entries:\n" + "\n".join(missing)

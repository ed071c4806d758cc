"""The tools depend one way: the local runtime (`taskplat.devstack`) imports no other tool.

The testkit, the bench and the chaos run (and the soak) start stacks with the local runtime; `make
up` must not need any of them. This test reads every module of tools/devstack/src and fails on an
import of `taskplat.testkit`, `taskplat.bench`, `taskplat.chaos` or `taskplat.soak`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "tools" / "devstack" / "src"
OTHER_TOOLS = ("taskplat.testkit", "taskplat.bench", "taskplat.chaos", "taskplat.soak")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _runtime_imports_of_other_tools() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        bad = {
            name
            for name in _imports(path)
            if any(name == tool or name.startswith(f"{tool}.") for tool in OTHER_TOOLS)
        }
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_local_runtime_imports_no_other_tool() -> None:
    assert _runtime_imports_of_other_tools() == {}


def test_the_check_reads_the_runtime() -> None:
    """Guards the check itself: it does see the runtime's own imports."""
    assert "taskplat.devstack.errors" in _imports(RUNTIME / "taskplat/devstack/cli.py")

"""Each package's tests import only their own helpers and the shared testkit.

The root pytest configuration puts every tests folder that holds helper modules on one import path
(`pythonpath` in pyproject.toml), so a helper's module name must be unique across those folders
(else one folder's helper silently shadows another's), and nothing but that import path stops one
package's tests from importing another's helpers. This test is that stop: it reads every test
module's imports and fails on a helper imported from another package's tests folder. A harness
that several packages need belongs in the shared testkit (tools/testkit, `taskplat.testkit`),
not in one package's tests. No exception is listed: every shared harness is in the testkit.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("libs", "services", "tools", "tests")


def _helper_folders() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    folders: list[str] = config["tool"]["pytest"]["ini_options"]["pythonpath"]
    return folders


def _helpers() -> dict[str, list[str]]:
    """Helper module name -> the tests folders on the import path that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for folder in _helper_folders():
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.stem != "conftest" and not path.stem.startswith("test_"):
                found[path.stem].append(folder)
    return found


def _tests_folder(path: Path) -> str:
    """The tests folder a module belongs to: the nearest ancestor named `tests`, or the first
    folder under the root `tests/`."""
    relative = path.relative_to(ROOT)
    parts = relative.parts
    if parts[0] == "tests":
        return "/".join(parts[:2])
    index = max(i for i, part in enumerate(parts) if part == "tests")
    return "/".join(parts[: index + 1])


def _test_modules() -> list[Path]:
    modules: list[Path] = []
    for top in SCANNED:
        for path in (ROOT / top).rglob("*.py"):
            relative = path.relative_to(ROOT).parts
            if "tests" in relative and not any(part.startswith(".") for part in relative):
                modules.append(path)
    return sorted(modules)


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _cross_imports_of(
    imports: list[tuple[str, set[str]]], helpers: dict[str, list[str]]
) -> set[tuple[str, str]]:
    """(tests folder, helper) for each helper a folder imports that lives in another folder."""
    found: set[tuple[str, str]] = set()
    for folder, names in imports:
        for name in names & set(helpers):
            if folder not in helpers[name]:
                found.add((folder, name))
    return found


def _cross_imports() -> set[tuple[str, str]]:
    imports = [(_tests_folder(path), _imported(path)) for path in _test_modules()]
    return _cross_imports_of(imports, _helpers())


def test_helper_module_names_are_unique_on_the_import_path() -> None:
    shared = {name: folders for name, folders in _helpers().items() if len(folders) > 1}
    assert shared == {}


def test_no_tests_import_another_packages_helpers() -> None:
    assert _cross_imports() == set(), "move the helper into the shared testkit (tools/testkit)"


def test_the_check_sees_a_cross_import() -> None:
    """Guards the check itself: the relay's tests importing the worker wrapper's harness (a real
    helper module) is reported, the wrapper's own tests importing it is not."""
    helpers = _helpers()
    assert helpers["wrapper_harness"] == ["services/worker-wrapper/tests"]
    imports = [
        ("services/outbox-relay/tests", {"wrapper_harness", "httpx"}),
        ("services/worker-wrapper/tests", {"wrapper_harness"}),
    ]
    assert _cross_imports_of(imports, helpers) == {
        ("services/outbox-relay/tests", "wrapper_harness")
    }

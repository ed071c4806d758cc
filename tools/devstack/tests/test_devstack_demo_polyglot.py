"""The set-up of `make demo`'s three-language pipeline: the operators file keeps the wrapper's
default operators and adds the three example operators; without built runtimes the part is
skipped with a reason. (The pipeline itself runs in tests/e2e/test_e2e_runtimes.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from taskplat.devstack.demo.polyglot import (
    PolyglotOperators,
    find_operators,
    pipeline,
    write_operators_file,
)


def test_without_built_runtimes_the_part_says_why(tmp_path: Path) -> None:
    if shutil.which("node") is None:
        assert find_operators(tmp_path) == "node is not installed"
    else:
        assert find_operators(tmp_path) == "the TypeScript runtime is not built (make runtimes)"


def test_the_operators_file_adds_the_three_example_operators(tmp_path: Path) -> None:
    operators = PolyglotOperators(
        "/usr/bin/node", tmp_path / "op.mjs", tmp_path / "bootstrap", tmp_path / "op.py"
    )
    written = yaml.safe_load(write_operators_file(tmp_path / "ops.yaml", operators).read_text())
    ops = written["operators"]
    assert {"echo", "emit", "rt-js", "rt-rs", "rt-py"} <= set(ops)
    assert ops["rt-js"]["command"] == ["/usr/bin/node", str(tmp_path / "op.mjs")]
    assert ops["rt-rs"]["command"] == [str(tmp_path / "bootstrap")]
    assert ops["rt-py"]["command"] == ["{python}", str(tmp_path / "op.py")]


@pytest.mark.parametrize("runtime", ["ecs", "lambda"])
def test_one_operator_per_language(runtime: str) -> None:
    jobs = pipeline(runtime, "p")["jobs"]
    assert [job["operator"] for job in jobs.values()] == ["rt-js", "rt-rs", "rt-py"]
    assert {job["runtime"] for job in jobs.values()} == {runtime}
    assert all(("timeout_seconds" in job) == (runtime == "lambda") for job in jobs.values())

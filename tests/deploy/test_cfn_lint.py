"""cfn-lint passes on every CloudFormation template of deploy/ (errors, warnings and
informational findings alike), and the linter really checks (a broken copy fails).

One cfn-lint run covers the templates and the broken copy (the linter takes seconds to start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import deploy_model
import pytest

LINT_TIMEOUT = 240
BROKEN = "broken-worker-pool.yaml"


@pytest.fixture(scope="module")
def lint_findings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """cfn-lint's findings (parseable lines) by file name."""
    executable = Path(sys.executable).parent / "cfn-lint"
    if not executable.exists():
        pytest.fail(f"cfn-lint is not installed next to {sys.executable} (run `make venv`)")
    paths = sorted(deploy_model.TEMPLATE_DIR.glob("*.yaml"))
    source = (deploy_model.TEMPLATE_DIR / "worker-pool.yaml").read_text(encoding="utf-8")
    broken = tmp_path_factory.mktemp("cfn") / BROKEN
    broken.write_text(source.replace("StopTimeout:", "StopTimout:", 1), encoding="utf-8")
    result = subprocess.run(
        [str(executable), "--include-checks", "I", "--format", "parseable", "--"]
        + [str(path) for path in [*paths, broken]],
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT,
        check=False,
    )
    assert not result.stderr.strip(), f"cfn-lint failed to run:\n{result.stderr}"
    findings: dict[str, list[str]] = {path.name: [] for path in [*paths, broken]}
    for line in result.stdout.splitlines():
        findings[Path(line.split(":", 1)[0]).name].append(line)
    return findings


def test_every_template_passes_cfn_lint(lint_findings: dict[str, list[str]]) -> None:
    templates = set(lint_findings) - {BROKEN}
    assert templates >= {"platform.yaml", "task-queue.yaml", "worker-pool.yaml"}
    found = [line for name in sorted(templates) for line in lint_findings[name]]
    assert not found, "cfn-lint findings:\n" + "\n".join(found)


def test_cfn_lint_rejects_a_broken_template(lint_findings: dict[str, list[str]]) -> None:
    assert any("E3002" in line for line in lint_findings[BROKEN]), lint_findings[BROKEN]

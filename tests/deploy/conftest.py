"""Fixtures of the deployment checks (tests/deploy): parsed templates, containers, compose file.

Invariants: these tests need neither AWS nor Docker nor the network; the templates and the compose
file are parsed once per session. This directory is put on `sys.path` so its tests import the
helper module `deploy_model` (a name unique in the repository).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import deploy_model


@pytest.fixture(scope="session")
def cfn_templates() -> dict[str, dict[str, Any]]:
    return deploy_model.templates()


@pytest.fixture(scope="session")
def ecs_containers(cfn_templates: dict[str, dict[str, Any]]) -> list[deploy_model.Container]:
    return deploy_model.containers(cfn_templates)


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return deploy_model.load_compose()


@pytest.fixture
def clean_settings_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No inherited variable a settings class could read (tests set exactly what they check)."""
    import os

    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith(("TASKPLAT_", "AWS_", "SQS_", "OTEL_")) or upper == "DATABASE_URL":
            monkeypatch.delenv(name)
    return monkeypatch

"""Fixtures of the devstack tests: the moto fallback's venv, built in the background while the
session runs other tests (the preparation "moto-venv" of `taskplat.testkit.prebuild`).

Invariant: the venv is the one `LocalSqs` falls back to (``ensure_moto_venv``, under its file
lock), built and compiled to bytecode by a subprocess at low priority; a test that needs it waits
for that build.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from taskplat.devstack.venvs import INSTALL_TIMEOUT
from taskplat.testkit import prebuild

_BUILD = "from taskplat.devstack.venvs import ensure_moto_venv; print(ensure_moto_venv())"


def _build_moto_venv() -> Path:
    built = prebuild.run(
        [sys.executable, "-c", _BUILD], Path.cwd(), "building the moto venv", INSTALL_TIMEOUT
    )
    python = Path(built.stdout.strip().splitlines()[-1])
    # Its bytecode too: ensure_moto_venv compiles none ahead, and with PYTHONDONTWRITEBYTECODE set
    # moto's server would compile every module it imports at each start.
    compile_all = [str(python), "-m", "compileall", "-qq", "-j", "0", str(python.parent.parent)]
    try:
        prebuild.run(compile_all, Path.cwd(), "compiling the moto venv", INSTALL_TIMEOUT)
    except pytest.fail.Exception:
        pass  # a module that does not compile is compiled (and reported) when imported
    return python


prebuild.register("moto-venv", _build_moto_venv)


@pytest.fixture(scope="session")
def moto_venv_python() -> Path:
    """The moto venv's python, once its background build is done."""
    python: Path = prebuild.result("moto-venv", INSTALL_TIMEOUT)
    return python

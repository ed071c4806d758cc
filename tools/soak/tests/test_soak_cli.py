"""``python -m taskplat.soak``: bad settings are refused with one line, before anything starts.

Invariants: the command ends before its settings would start a stack; it has a deadline.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _soak(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "taskplat.soak", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_soak_refuses_bad_settings_with_one_line(tmp_path: Path) -> None:
    result = _soak("--dir", str(tmp_path / "run"), "--rate", "0")
    assert result.returncode == 2
    assert "must be positive" in result.stderr
    result = _soak("--dir", str(tmp_path / "run"), "--duration", "5", "--sample-every", "10")
    assert result.returncode == 1
    assert result.stderr.startswith("soak: error: the soak must last at least two sampling")
    result = _soak("--dir", str(tmp_path / "run"), "--records-per-second", "-1")
    assert result.returncode == 1
    assert "records per second and the job interval must be 0 or more" in result.stderr
    assert "Traceback" not in result.stderr

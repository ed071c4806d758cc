"""``python -m taskplat.chaos``: bad settings are refused with one
line, before anything starts.

Invariants: every command ends before its settings would start a stack; each has a deadline.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _command(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", module, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _chaos(*args: str) -> subprocess.CompletedProcess[str]:
    return _command("taskplat.chaos", *args)


def test_chaos_refuses_bad_fault_rates_before_starting_anything(tmp_path: Path) -> None:
    result = _chaos("--dir", str(tmp_path / "run"), "--lose", "1.5")
    assert result.returncode == 2
    assert "a share is between 0 and 1" in result.stderr
    result = _chaos("--dir", str(tmp_path / "run"), "--lose", "0.6", "--duplicate", "0.6")
    assert result.returncode == 1
    assert result.stderr.startswith("chaos: error: lose + duplicate must not exceed 1")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_chaos_refuses_bad_replicas_and_variants(tmp_path: Path) -> None:
    result = _chaos("--dir", str(tmp_path / "run"), "--replicas", "0")
    assert result.returncode == 2
    assert "must be 1 or more" in result.stderr
    result = _chaos("--dir", str(tmp_path / "run"), "--variant", "sometimes")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
    result = _chaos("--dir", str(tmp_path / "run"), "--variant", "both", "--no-waiting-claims")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr
    assert not (tmp_path / "run").exists()


def test_chaos_refuses_a_rate_without_its_burst_and_bad_limits(tmp_path: Path) -> None:
    result = _chaos("--dir", str(tmp_path / "run"), "--rate", "10")
    assert result.returncode == 1
    assert result.stderr.startswith("chaos: error: --rate and --burst go together")
    result = _chaos("--dir", str(tmp_path / "run"), "--concurrency-limit", "0")
    assert result.returncode == 2
    assert "must be 1 or more" in result.stderr
    assert not (tmp_path / "run").exists()

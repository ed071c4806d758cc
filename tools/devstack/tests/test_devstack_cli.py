"""``python -m taskplat.devstack``: clear failures, and the foreground server lifecycle.

Invariants: every process a test starts is ended by the test; reads and waits have deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from taskplat.devstack.postgres import PrivatePostgres

CLI = [sys.executable, "-m", "taskplat.devstack"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("command", ["postgres", "sqs"])
def test_a_file_as_dir_fails_with_a_message(tmp_path: Path, command: str) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = _run(command, "--dir", str(not_a_dir))
    assert result.returncode == 1
    assert result.stderr.startswith("devstack: error: ")
    assert "is not a directory" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_an_uncreatable_dir_fails_with_a_message(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = _run("postgres", "--dir", str(blocker / "sub"))
    assert result.returncode == 1
    assert "cannot create --dir" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_port_is_a_usage_error(tmp_path: Path) -> None:
    result = _run("postgres", "--dir", str(tmp_path), "--port", "70000")
    assert result.returncode == 2
    assert "port out of range" in result.stderr


def test_install_localstack_without_python313_fails_unless_optional(tmp_path: Path) -> None:
    env = dict(os.environ, TASKPLAT_PYTHON313=str(tmp_path / "no-python3.13"))
    argv = [*CLI, "install-localstack", "--venv", str(tmp_path / "venv")]
    strict = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert strict.returncode == 1
    assert "no working python3.13" in strict.stderr
    optional = subprocess.run(
        [*argv, "--optional"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert optional.returncode == 0, optional.stderr
    assert optional.stdout == ""
    assert "devstack: warning: LocalStack cannot be installed" in optional.stderr
    assert "moto" in optional.stderr and "Traceback" not in optional.stderr
    assert not (tmp_path / "venv").exists()


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_postgres_runs_in_the_foreground_until_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "postgres", "--dir", str(tmp_path / "pg")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # ends at the latest when the CLI exits
        assert line.startswith("DATABASE_URL=postgresql://taskplat@127.0.0.1:"), line
        url = line.removeprefix("DATABASE_URL=")
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        pid_file = (tmp_path / "pg" / "data").resolve() / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _wait_gone(postmaster, timeout=10), "the postmaster outlived the CLI"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        # The CLI keeps its data on purpose; as root it may live in /tmp/taskplat-pg-*.
        PrivatePostgres(tmp_path / "pg").stop(remove_data=True)

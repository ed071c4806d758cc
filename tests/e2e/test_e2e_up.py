"""End to end: `python -m taskplat.devstack up` (what `make up` runs) as a real command, with its
own private Postgres and LocalStack SQS in a temporary directory and a free dispatcher port.

Covers what the other modules cannot: the command line, the printed and written settings, the
secrets and the data kept across restarts, a clean stop on SIGTERM, no orphan left by a crashed
(SIGKILLed) supervisor, and the refusal of a taken dispatcher port.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2e_stack import process_gone

from taskplat.devstack.ports import free_port
from taskplat.devstack.postgres import PrivatePostgres
from taskplat.devstack.stack.secrets import read_env_file
from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e

START_TIMEOUT = 180.0  # a first start builds the Postgres cluster (and maybe the LocalStack venv)


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


def _env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SQS_ENDPOINT_URL")}
    env.update(TASKPLAT_DISPATCHER_PORT=str(port), TASKPLAT_WORKERS="1")
    # The stopping wrapper waits for its open waiting claim and its SQS receive in flight:
    # short ones keep the stop quick.
    env["TASKPLAT_WORKER_POLL_WAIT_SECONDS"] = "1"
    env["TASKPLAT_WORKER_WAIT_TIME_SECONDS"] = "1"
    return env


def _start_up(run_dir: Path, port: int, name: str) -> Up:
    stdout, stderr = run_dir.parent / f"{name}.out", run_dir.parent / f"{name}.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "taskplat.devstack", "up", "--dir", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=_env(port),
            start_new_session=True,
        )
    return Up(process, stdout, stderr)


def _wait_up(up: Up, env_file: Path) -> dict[str, str]:
    def ready() -> bool:
        if up.process.poll() is not None:
            raise AssertionError(f"`up` exited with {up.process.returncode}:\n{up.output()}")
        return env_file.exists()

    wait_for(ready, timeout=START_TIMEOUT, what="stack.env", interval=0.2)
    return read_env_file(env_file)


def _descendants(root: int) -> set[int]:
    """Every process below `root` (by parent pid), found in /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        children = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= children
        frontier = children
    return found


def _cli_submit_waits(values: dict[str, str], config: dict[str, str]) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASKPLAT_")}
    env.update(TASKPLAT_URL=values["TASKPLAT_URL"], TASKPLAT_API_KEY=values["TASKPLAT_API_KEY"])
    cli = [sys.executable, "-m", "taskplat.client", "submit", "echo", "--wait", "--json"]
    result = subprocess.run(
        [*cli, "--config", json.dumps(config), "--wait-timeout", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    task: dict[str, object] = json.loads(result.stdout)
    return task


def _echo_completes(values: dict[str, str], payload: dict[str, str]) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {values['TASKPLAT_API_KEY']}"}
    url = values["DISPATCHER_URL"]
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        created = client.post("/tasks", json={"operator": "echo", "config": payload})
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]

        def completed() -> dict[str, object] | None:
            task: dict[str, object] = client.get(f"/tasks/{task_id}").json()
            return task if task["status"] == "Completed" else None

        task = wait_for(completed, timeout=30, what="the echo task to complete", interval=0.05)
        assert task is not None
        return task


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "run"
    yield directory
    PrivatePostgres(directory / "postgres").stop(remove_data=True)  # relocated data too


def _data_services_answer(values: dict[str, str]) -> None:
    """The broker and the query service of `up` verify the dispatcher's capability tokens."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from taskplat.common.settings import CapabilityTokenSettings
    from taskplat.common.tokens.capability import (
        StorageLayout,
        build_capability,
        capability_key_ring,
        issue_capability_token,
    )
    from taskplat.common.tokens.keys import key_settings
    from taskplat.devstack.stack.data_services import DATA_BUCKET, capability_env

    fragment = CapabilityTokenSettings(**capability_env(values["TASKPLAT_WORKER_TOKEN"]))
    keys = key_settings(
        fragment.capability_token_keys, fragment.capability_token_active_kid, what="keys"
    )
    assert keys is not None
    capability = build_capability(uuid.uuid4(), 1, [], [], layout=StorageLayout(DATA_BUCKET))
    now = datetime.now(UTC)
    token = issue_capability_token(
        capability_key_ring(keys), capability, now=now, expires_at=now + timedelta(minutes=5)
    )
    headers = {"Authorization": f"Bearer {token}"}
    answer = httpx.post(
        f"{values['TASKPLAT_QUERY_URL']}/query", headers=headers, json={"sql": "SELECT 42"}
    )
    assert answer.status_code == 200 and answer.json()["rows"] == [[42]], answer.text
    credentials = httpx.post(f"{values['TASKPLAT_CREDENTIALS_URL']}/credentials", headers=headers)
    assert credentials.status_code == 200, credentials.text
    assert credentials.json()["write_prefixes"] == [capability.scratch_prefix]


def test_up_runs_the_platform_and_survives_a_crash_of_its_supervisor(run_dir: Path) -> None:
    port = free_port()
    env_file = run_dir / "stack.env"
    first = _start_up(run_dir, port, "first")
    try:
        values = _wait_up(first, env_file)
        assert values["DISPATCHER_URL"] == f"http://127.0.0.1:{port}"
        assert set(values) == {
            "DISPATCHER_URL",
            "TASKPLAT_URL",
            "TASKPLAT_API_KEY",
            "TASKPLAT_WORKER_TOKEN",
            "DATABASE_URL",
            "SQS_ENDPOINT_URL",
            "TASKPLAT_CREDENTIALS_URL",
            "TASKPLAT_QUERY_URL",
        }
        _data_services_answer(values)
        assert env_file.stat().st_mode & 0o777 == 0o600
        assert (run_dir / "secrets.env").stat().st_mode & 0o777 == 0o600
        task = _echo_completes(values, {"hello": "world"})
        assert task["result"] == {"hello": "world"}
        # A new user drives the stack with `taskplat` and the values of stack.env alone.
        assert _cli_submit_waits(values, {"via": "cli"})["result"] == {"via": "cli"}
        wait_for(
            lambda: (
                re.search(r"^dispatcher +\|", first.output(), re.M) is not None
                and "worker-1" in first.output()
            ),
            timeout=10,
            what="prefixed service output",
        )
        assert f"DISPATCHER_URL=http://127.0.0.1:{port}" in first.output()
        children = _descendants(first.process.pid)
        # postgres, sqs, dispatcher, relay, scheduler, reaper, sink, broker, query service, worker
        assert len(children) >= 9
    finally:
        first.process.kill()  # a crash: no clean-up code of the supervisor runs
        first.process.wait(timeout=10)

    # Every child dies with the supervisor (PR_SET_PDEATHSIG): nothing is left behind.
    wait_for(
        lambda: all(process_gone(pid) for pid in children),
        timeout=60,
        what="every process of the crashed stack to exit",
        interval=0.2,
    )

    # A new `up` in the same directory keeps the secrets and the database's data.
    second = _start_up(run_dir, port, "second")
    try:
        env_file.unlink(missing_ok=True)  # the crashed run could not remove it
        values_again = _wait_up(second, env_file)
        assert values_again["TASKPLAT_API_KEY"] == values["TASKPLAT_API_KEY"]
        assert values_again["TASKPLAT_WORKER_TOKEN"] == values["TASKPLAT_WORKER_TOKEN"]
        headers = {"Authorization": f"Bearer {values['TASKPLAT_API_KEY']}"}
        kept = httpx.get(f"{values['DISPATCHER_URL']}/tasks/{task['task_id']}", headers=headers)
        assert kept.status_code == 200 and kept.json()["status"] == "Completed"
        _echo_completes(values_again, {"again": "yes"})
        children = _descendants(second.process.pid)
    finally:
        second.process.send_signal(signal.SIGTERM)
        code = second.process.wait(timeout=90)
    assert code == 0, second.output()
    assert all(process_gone(pid) for pid in children)
    assert not env_file.exists()


def test_up_refuses_a_taken_dispatcher_port(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "taskplat.devstack", "up", "--dir", str(tmp_path / "run")],
            env=_env(port),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "postgres").exists()  # refused before starting anything

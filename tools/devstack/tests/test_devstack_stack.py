"""The stack's building blocks without the platform: the supervisor with small real child
processes, the secrets and env files, the config from the environment, the log echo, and the
demo's arithmetic. (The whole stack runs in tests/e2e.)"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskplat.devstack.demo.run import percentile, summarize
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.stack import ServiceSpec, Stack, StackConfig, Supervisor, from_environment
from taskplat.devstack.stack.echo import LogEcho
from taskplat.devstack.stack.secrets import load_or_create_secrets, read_env_file
from taskplat.devstack.waiting import wait_for

SLEEPER = "import os, sys, time; open(sys.argv[1], 'a').write(os.environ['GEN'] + '\\n'); " + (
    "time.sleep(120)"
)


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    running = Supervisor(tmp_path / "logs", restart_backoff=0.05, restart_backoff_max=0.2)
    running.start()
    yield running
    running.close()


def _sleeper(name: str, record: Path) -> ServiceSpec:
    return ServiceSpec(
        name=name,
        argv=(sys.executable, "-c", SLEEPER, str(record)),
        env={"PATH": "/usr/bin:/bin"},
        stop_timeout=5,
        generation_env="GEN",
    )


def test_a_killed_service_is_restarted_as_a_new_generation(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    record = tmp_path / "starts.txt"
    pid = supervisor.add(_sleeper("svc", record))
    wait_for(lambda: record.exists(), timeout=10, what="the first start")

    assert supervisor.kill("svc", signal.SIGKILL) == pid

    wait_for(lambda: supervisor.pids().get("svc") not in (None, pid), timeout=10, what="a restart")
    wait_for(lambda: len(record.read_text().split()) == 2, timeout=10, what="the second start")
    assert record.read_text().split() == ["svc.0", "svc.1"]
    assert supervisor.exits("svc") == [-signal.SIGKILL]
    assert supervisor.generation("svc") == 1


def test_a_crashing_service_keeps_being_restarted(supervisor: Supervisor) -> None:
    spec = ServiceSpec(name="crasher", argv=(sys.executable, "-c", "raise SystemExit(3)"), env={})
    supervisor.add(spec)

    wait_for(lambda: len(supervisor.exits("crasher")) >= 3, timeout=20, what="three exits")
    assert set(supervisor.exits("crasher")) == {3}


def test_removed_and_closed_services_stop_and_stay_stopped(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    supervisor.add(_sleeper("a", tmp_path / "a.txt"))
    supervisor.add(_sleeper("b", tmp_path / "b.txt"))
    pids = supervisor.pids()

    assert supervisor.remove("a") == -signal.SIGTERM
    assert supervisor.names() == ["b"]
    supervisor.close()

    assert supervisor.pids() == {}
    with pytest.raises(DevstackError, match="not running"):
        supervisor.add(_sleeper("c", tmp_path / "c.txt"))
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_secrets_are_created_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    first = load_or_create_secrets(path)
    second = load_or_create_secrets(path)

    assert first == second
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_env_file(path) == {
        "TASKPLAT_API_KEY": first.api_key,
        "TASKPLAT_WORKER_TOKEN": first.worker_token,
    }
    assert len(first.api_key) >= 16 and len(first.worker_token) >= 16


def test_a_secrets_file_without_both_values_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    path.write_text("TASKPLAT_API_KEY=only-this-one-0123456789\n")

    with pytest.raises(DevstackError, match="lacks"):
        load_or_create_secrets(path)


def test_config_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TASKPLAT_WORKERS", "0")
    monkeypatch.setenv("TASKPLAT_QUEUES", "default, batch ,default")
    monkeypatch.setenv("TASKPLAT_DISPATCHER_PORT", "18080")
    monkeypatch.delenv("DATABASE_URL", raising=False)

    config = from_environment(tmp_path)

    assert config.workers == 0
    assert config.queues == ("default", "batch")
    assert config.served_queues == ("default", "batch")
    assert config.dispatcher_port == 18080
    assert config.database_url is None


@pytest.mark.parametrize(
    ("name", "value"), [("TASKPLAT_WORKERS", "two"), ("TASKPLAT_DISPATCHER_PORT", "70000")]
)
def test_bad_environment_values_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)

    with pytest.raises(DevstackError, match=name):
        from_environment(tmp_path)


def test_a_taken_dispatcher_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        stack = Stack(StackConfig(run_dir=tmp_path / "run", dispatcher_port=port))

        with pytest.raises(DevstackError, match=f"port {port} .* already in use"):
            stack.start()
    assert not (tmp_path / "run" / "postgres").exists()


def test_log_echo_prefixes_new_complete_lines(tmp_path: Path) -> None:
    lines: list[str] = []
    log = tmp_path / "svc.log"
    log.write_text("old line\n")
    echo = LogEcho(lines.append, color=False)
    echo.follow("svc", log)
    echo.start()
    with log.open("a") as f:
        f.write("one\ntw")
        f.flush()
        wait_for(lambda: len(lines) == 1, timeout=5, what="the first line")
        f.write("o\n")
    wait_for(lambda: len(lines) == 2, timeout=5, what="the second line")
    echo.stop()

    assert [line.split("|", 1) for line in lines] == [
        ["svc        ", " one"],
        ["svc        ", " two"],
    ]


def test_demo_percentiles_and_summary() -> None:
    values = [float(n) for n in range(1, 101)]
    assert [percentile(values, p) for p in (50, 95, 99)] == [50.0, 95.0, 99.0]
    tasks = [
        {
            "status": "Completed",
            "created_at": "2026-01-01T00:00:00+00:00",
            "finished_at": "2026-01-01T00:00:02+00:00",
            "attempts": [{"started_at": "2026-01-01T00:00:00.500000+00:00"}],
        },
        {
            "status": "Dead",
            "created_at": "2026-01-01T00:00:01+00:00",
            "finished_at": "2026-01-01T00:00:04+00:00",
            "attempts": [{"started_at": "2026-01-01T00:00:02+00:00"}],
        },
    ]

    summary = summarize(tasks, submitted=2)

    assert summary.completed == 1
    assert summary.elapsed_seconds == 4.0
    assert summary.tasks_per_second == 0.25
    assert summary.latencies == [0.5, 1.0]


def test_workers_get_no_signing_keys_nor_database(tmp_path: Path) -> None:
    from taskplat.devstack.stack.services import worker_spec

    shared = {
        "DATABASE_URL": "postgresql://x",
        "TASKPLAT_API_KEYS": "k",
        "TASKPLAT_ATTEMPT_TOKEN_KEYS": '{"devstack": "secret"}',
        "TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID": "devstack",
        "TASKPLAT_CAPABILITY_TOKEN_KEYS": '{"devstack-capability": "secret"}',
        "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID": "devstack-capability",
        "TASKPLAT_WORKER_TOKEN": "t",
    }
    env = worker_spec("worker-1", "default", shared, {}, cwd=tmp_path).env
    assert set(env) == {"TASKPLAT_WORKER_TOKEN", "TASKPLAT_WORKER_QUEUE"}


def test_data_services_get_public_keys_only() -> None:
    """`make up`'s broker and query service verify capability tokens with the public half of the
    dispatcher's key, and get no private key, no attempt-token key and no database URL."""
    import json

    from pydantic import SecretStr

    from taskplat.common.tokens.keys import TokenKeySettings
    from taskplat.devstack.stack.bootstrap import attempt_key
    from taskplat.devstack.stack.data_services import capability_env, service_envs

    signer = capability_env("worker-token-of-the-test")
    shared = {
        **signer,
        "DATABASE_URL": "postgresql://x",
        "TASKPLAT_API_KEYS": "k",
        "TASKPLAT_WORKER_TOKEN": "t",
        "TASKPLAT_ATTEMPT_TOKEN_KEYS": json.dumps({"devstack": attempt_key("t")}),
        "TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID": "devstack",
    }
    signing = TokenKeySettings.model_validate_json(
        json.dumps(
            {
                "keys": json.loads(signer["TASKPLAT_CAPABILITY_TOKEN_KEYS"]),
                "active_kid": signer["TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID"],
            }
        )
    )
    assert {signing.kind(kid) for kid in signing.keys} == {"private"}
    envs = service_envs(
        shared, endpoint_url="http://s3", broker_port=1, query_port=2, query_database_url="q"
    )
    for name, env in envs.items():
        assert not {
            "DATABASE_URL",
            "TASKPLAT_WORKER_TOKEN",
            "TASKPLAT_ATTEMPT_TOKEN_KEYS",
            "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID",
        } & set(env), name
        assert "PRIVATE KEY" not in json.dumps(env), name
        keys = json.loads(env["TASKPLAT_CAPABILITY_TOKEN_KEYS"])
        held = TokenKeySettings(keys={k: SecretStr(v) for k, v in keys.items()})
        assert held == signing.public(), name

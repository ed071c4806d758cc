"""The operators' `taskplat` commands against a real dispatcher, run in-process (the same `run`
the console script calls): queues, workers, stats, job runs, DAG and dataset details, keys (the
secret shown once), the audit log, time filters, `--version` and shell completion; each in human
form and as `--json`."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from taskplat.client.cli import run
from taskplat.testkit.dispatcher_calls import claimed, emit_events
from taskplat.testkit.dispatcher_harness import API_KEY, Dispatcher
from taskplat.testkit.loops_rows import LoopRows

PIPELINE = {"jobs": {"follow": {"operator": "echo",
                                "outputs": [{"index": 0, "dataset": "blocks"}]}}}  # fmt: skip


class Cli:
    def __init__(self, dispatcher: Dispatcher, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = dispatcher.base_url
        self.capsys = capsys

    def __call__(self, *args: str, key: str = API_KEY) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = run(["--url", self.url, "--api-key", key, *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str, key: str = API_KEY) -> Any:
        code, out, err = self(*args, "--json", key=key)
        assert code == 0, err
        return json.loads(out)

    def human(self, *args: str, key: str = API_KEY) -> str:
        code, out, err = self(*args, key=key)
        assert code == 0, err
        return out


@pytest.fixture
def quiet_server() -> Iterator[None]:
    """The in-process dispatcher logs nothing: stdout and stderr are the command's alone."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture
def cli(
    quiet_server: None,
    dispatcher: Dispatcher,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    monkeypatch.setenv("COLUMNS", "200")
    for name in ("TASKPLAT_URL", "TASKPLAT_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return Cli(dispatcher, capsys)


def test_queues_list_pause_resume_register(cli: Cli, db_url: str) -> None:
    assert "alpha" in cli.human("queues", "list")
    assert "missing" not in cli.human("queues", "list")
    rows = LoopRows(db_url)  # the relay holds alpha: its SQS queue does not exist
    try:
        rows.set_queue_sqs_missing("alpha", True)
    finally:
        rows.close()
    [alpha] = [line for line in cli.human("queues", "list").splitlines() if "alpha" in line]
    assert alpha.split()[:3] == ["alpha", "running", "missing"]
    assert {q["name"]: q["sqs"]["state"] for q in cli.json("queues", "list")["queues"]}[
        "alpha"
    ] == "missing"
    names = [q["name"] for q in cli.json("queues", "list")["queues"]]
    assert "alpha" in names and "brand-new" not in names
    assert cli.json("queues", "pause", "alpha")["paused"] is True
    assert "alpha running" in cli.human("queues", "resume", "alpha")
    assert "brand-new registered" in cli.human("queues", "register", "brand-new")
    assert cli.json("queues", "register", "brand-new")["name"] == "brand-new"
    code, out, err = cli("queues", "pause", "ghost")
    assert code == 1 and out == "" and err.startswith("taskplat: ") and "ghost" in err


def test_queues_limits_shows_sets_replaces_and_clears(cli: Cli) -> None:
    assert cli.human("queues", "limits", "alpha") == "alpha limits: none\n"
    set_ = cli.json("queues", "limits", "alpha", "--concurrency", "3", "--key-concurrency", "1",
                    "--rate", "10", "--burst", "5")  # fmt: skip
    assert set_["limits"] == {
        "concurrency_limit": 3, "key_concurrency_limit": 1,
        "rate_limit": {"per_second": 10.0, "burst": 5},
    }  # fmt: skip
    assert set_["limits_use"] == {"running": 0, "keys_at_limit": 0, "tokens_left": 5}
    assert cli.human("queues", "limits", "alpha") == (
        "alpha limits: concurrency 0/3, per key 1 (0 at it), rate 10/s burst 5 (5 left)\n"
    )
    [alpha] = [line for line in cli.human("queues", "list").splitlines() if "alpha" in line]
    assert "concurrency 0/3" in alpha
    # The options given replace every limit.
    replaced = cli.json("queues", "limits", "alpha", "--concurrency", "7")["limits"]
    assert replaced == {"concurrency_limit": 7, "key_concurrency_limit": None, "rate_limit": None}
    assert "alpha limits: none" in cli.human("queues", "limits", "alpha", "--clear")
    for bad in (["--rate", "5"], ["--clear", "--concurrency", "2"], ["--concurrency", "0"]):
        code, out, err = cli("queues", "limits", "alpha", *bad)
        assert code == 2 and out == "" and err, bad
    assert cli.json("queues", "limits", "alpha")["limits"]["concurrency_limit"] is None
    # The server's own range: a rate above its maximum answers 422, changing nothing.
    code, out, err = cli("queues", "limits", "alpha", "--rate", "1e9", "--burst", "1")
    assert code == 1 and out == "" and "422" in err
    assert cli.json("queues", "limits", "alpha")["limits"]["rate_limit"] is None
    code, _, err = cli("queues", "limits", "ghost")
    assert code == 1 and "ghost" in err


def test_submit_takes_a_priority(cli: Cli) -> None:
    task = cli.json("submit", "echo", "--priority", "0")
    assert task["priority"] == 0
    code, _, _ = cli("submit", "echo", "--priority", "10")
    assert code == 2


def test_keys_create_list_revoke_and_the_audit_log(cli: Cli) -> None:
    code, out, err = cli("keys", "create", "viewer", "--scope", "read")
    assert code == 0
    secret = out.strip()
    assert secret.startswith("tpk_") and "not shown again" in err
    created = cli.json("keys", "create", "ops", "--scope", "operate", "--scope", "read")
    assert created["scopes"] == ["operate", "read"] and created["key"].startswith("tpk_")
    listed = cli.human("keys", "list")
    assert "viewer" in listed and "ops" in listed and secret not in listed
    assert [k["name"] for k in cli.json("keys", "list")["keys"]] == ["ops", "viewer"]
    code, _, err = cli("submit", "echo", key=secret)
    assert code == 1 and "'submit' scope" in err
    assert cli.json("queues", "pause", "beta", key=created["key"])["paused"] is True
    assert "revoked key viewer" in cli.human("keys", "revoke", "viewer")
    assert cli.json("keys", "revoke", "ops") == {"name": "ops", "revoked": True}
    code, _, err = cli("queues", "list", key=secret)
    assert code == 1 and "API key" in err
    entries = cli.json("audit", "--key", "ops")["entries"]
    assert [(e["action"], e["target"], e["outcome"]) for e in entries] == [
        ("pause_queue", "beta", "paused")
    ]
    table = cli.human("audit", "--action", "revoke_key")
    assert "viewer" in table and "ops" in table and "bootstrap" in table
    assert len(cli.json("audit", "--limit", "2")["entries"]) == 2
    assert cli.json("audit", "--since", "2999-01-01")["entries"] == []


def test_workers_stats_and_list_filters(cli: Cli, dispatcher: Dispatcher) -> None:
    assert cli.json("workers") == {"workers": [], "lost_after_seconds": 60.0}
    body = {"worker_id": "w-9", "queue": "alpha", "max": 1,
            "worker": {"worker_id": "w-9", "queues": ["alpha"], "slots": 3,
                       "version": "9.9", "running": []}}  # fmt: skip
    assert dispatcher.worker.post("/internal/task-claim-next", json=body).status_code == 200
    assert "w-9" in cli.human("workers") and "alive" in cli.human("workers")
    assert cli.json("workers")["workers"][0]["slots"] == 3
    early = cli.json("submit", "echo", "--idempotency-key", "k-1", "--expires-at",
                     "2031-01-01T00:00:00+00:00")  # fmt: skip
    assert early["expires_at"].startswith("2031-01-01")
    dispatcher.clock.advance(3600)
    later = cli.json("submit", "echo", "--scheduled-for", "2030-06-01T00:00:00+00:00")
    assert later["status"] == "Scheduled"
    since = cli.json("list", "--since", "2030-01-01T00:30:00+00:00")["tasks"]
    assert [t["task_id"] for t in since] == [later["task_id"]]
    until = cli.json("list", "--until", "2030-01-01T00:30:00+00:00")["tasks"]
    assert [t["task_id"] for t in until] == [early["task_id"]]
    assert "Queued" in cli.human("stats") and "last hour" in cli.human("stats")
    counts = cli.json("stats")["counts"]
    assert {c["status"] for c in counts} == {"Queued", "Scheduled"}


def test_runs_dags_and_datasets(cli: Cli, dispatcher: Dispatcher) -> None:
    assert dispatcher.api.put("/dags/pipe", json=PIPELINE).status_code == 201
    run_task = cli.json("runs", "start", "pipe", "follow", "--config", '{"n": 1}')
    assert run_task["job"] == {"dag_name": "pipe", "name": "follow"}
    assert "Queued" in cli.human("runs", "start", "pipe", "follow")
    assert [t["task_id"] for t in cli.json("list", "--dag", "pipe", "--job", "follow")["tasks"]]
    assert "follow" in cli.human("dags", "get", "pipe")
    assert cli.json("dags", "get", "pipe")["jobs"][0]["name"] == "follow"
    dataset = cli.json("datasets", "list")["datasets"][0]
    uuid = dataset["dataset_uuid"]
    lease = claimed(dispatcher, run_task["task_id"])
    event = {"dataset_uuid": uuid, "dataset_version": dataset["current_version"], "cursor": 5}
    assert emit_events(dispatcher, lease, [event]).status_code == 200
    assert "blocks" in cli.human("datasets", "get", uuid)
    assert cli.json("datasets", "get", uuid)["name"] == "blocks"
    assert cli.json("datasets", "events", uuid)["events"][0]["cursor"] == 5
    assert "5" in cli.human("datasets", "events", uuid)
    assert len(cli.json("datasets", "versions", uuid)["versions"]) == 1
    code, out, err = cli("datasets", "versions", uuid, "--new")
    assert code == 0 and "new version" in err and out.count("True") == 1
    assert len(cli.json("datasets", "versions", uuid)["versions"]) == 2
    assert "deleted DAG pipe" in cli.human("dags", "delete", "pipe")
    code, _, err = cli("dags", "delete", "pipe")
    assert code == 1 and "not found" in err


def test_version_help_and_shell_completion(cli: Cli) -> None:
    code, out, _ = cli("--version")
    assert code == 0 and out.startswith("taskplat, version ")
    for command in (["queues"], ["keys", "create"], ["audit"], ["workers"], ["runs", "start"],
                    ["datasets", "events"], ["dags", "delete"], ["completion"]):  # fmt: skip
        code, out, _ = cli(*command, "--help")
        assert code == 0 and out.startswith("Usage: taskplat"), command
    code, out, _ = cli("completion", "bash")
    assert code == 0 and "_TASKPLAT_COMPLETE" in out and "complete " in out
    code, out, _ = cli("completion", "zsh")
    assert code == 0 and "compdef" in out

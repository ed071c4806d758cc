"""LocalSqs: a real SQS endpoint (LocalStack, or moto as the fallback) driven with boto3.

Invariants: every server a test starts is stopped by the test; waits are long polls or loops with
deadlines, never bare sleeps.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from taskplat.devstack import sqs as sqs_module
from taskplat.devstack.errors import DevstackError
from taskplat.devstack.sqs import LocalSqs, sqs_client

if TYPE_CHECKING:
    from types_boto3_sqs.type_defs import MessageTypeDef


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _round_trip(endpoint_url: str) -> None:
    client = sqs_client(endpoint_url)
    try:
        queue_url = client.create_queue(QueueName="devstack-test")["QueueUrl"]
        assert queue_url.startswith(endpoint_url + "/")
        client.send_message(QueueUrl=queue_url, MessageBody='{"task_id": "t-1"}')
        received: list[MessageTypeDef] = []
        deadline = time.monotonic() + 20
        while not received and time.monotonic() < deadline:
            reply = client.receive_message(QueueUrl=queue_url, WaitTimeSeconds=2)
            received = reply.get("Messages", [])
        assert [m["Body"] for m in received] == ['{"task_id": "t-1"}']
        client.delete_message(QueueUrl=queue_url, ReceiptHandle=received[0]["ReceiptHandle"])
        attributes = client.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        assert attributes["ApproximateNumberOfMessages"] == "0"
        assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    finally:
        client.close()


def test_sqs_client_ignores_the_callers_aws_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    client = sqs_client("http://127.0.0.1:9")
    try:
        assert client.meta.region_name == "us-east-1"
        assert client.meta.endpoint_url == "http://127.0.0.1:9"
    finally:
        client.close()


def test_local_sqs_send_receive_delete(tmp_path: Path) -> None:
    sqs = LocalSqs(tmp_path / "sqs")
    with sqs:
        assert sqs.kind in ("localstack", "moto")
        assert sqs.endpoint_url.startswith("http://127.0.0.1:")
        pid = sqs.pid
        assert pid is not None
        _round_trip(sqs.endpoint_url)
    assert _group_gone(pid)
    assert sqs.pid is None
    sqs.stop()  # idempotent


@pytest.mark.prebuild("moto-venv")
def test_falls_back_to_moto_when_localstack_cannot_be_installed(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    moto_venv_python: Path,
) -> None:
    # moto_venv_python: the venv the fallback starts moto from, built in the background.
    def broken_install(cache_dir: Path | None = None, *, uv: str | None = None) -> Path:
        raise DevstackError("simulated: LocalStack cannot be installed")

    monkeypatch.setattr(sqs_module, "ensure_localstack_venv", broken_install)
    # This simulated fallback must not reach the run's summary (it lists real ones).
    monkeypatch.setattr(sqs_module, "_FALLBACKS", [])
    sqs = LocalSqs(tmp_path / "sqs")
    with caplog.at_level(logging.WARNING, logger="taskplat.devstack"):
        with sqs:
            assert sqs.kind == "moto"
            _round_trip(sqs.endpoint_url)
    assert "falling back to moto" in caplog.text
    assert "simulated" in caplog.text
    assert sqs.fallback_reason == "simulated: LocalStack cannot be installed"
    assert sqs_module.fallbacks() == [sqs.fallback_reason]

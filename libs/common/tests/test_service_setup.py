"""A service's first set-up: the thread switch interval comes from its settings, and a bad one is
refused by name."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from taskplat.common.service_setup import configure_service
from taskplat.common.settings import ServiceSettings


@pytest.fixture
def restored_switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("restored_switch_interval")
def test_the_switch_interval_is_the_settings() -> None:
    configure_service("test", ServiceSettings())
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    configure_service("test", ServiceSettings(thread_switch_interval_seconds=0.002))
    assert sys.getswitchinterval() == pytest.approx(0.002)


@pytest.mark.parametrize("value", ["0", "-1", "2", "soon"])
def test_a_bad_switch_interval_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TASKPLAT_THREAD_SWITCH_INTERVAL_SECONDS", value)
    with pytest.raises(ValidationError) as raised:
        ServiceSettings()
    assert "TASKPLAT_THREAD_SWITCH_INTERVAL_SECONDS" in str(raised.value)


def test_a_service_process_exits_with_a_message_on_a_bad_interval() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "taskplat.reaper"],
        env={"TASKPLAT_THREAD_SWITCH_INTERVAL_SECONDS": "0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "TASKPLAT_THREAD_SWITCH_INTERVAL_SECONDS: Input should be greater than 0" in done.stderr
    assert "Traceback" not in done.stderr

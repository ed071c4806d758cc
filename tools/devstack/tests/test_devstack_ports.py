"""The port picker: below the ephemeral range, one band per xdist worker, never the same twice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from taskplat.devstack.ports import free_port

_PICK_FIVE = (
    "from taskplat.devstack.ports import free_port; print(*[free_port() for _ in range(5)])"
)


def _ephemeral_start() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        return int(handle.read().split()[0])


def _ports_in(worker: str) -> set[int]:
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker}
    out = subprocess.run(
        [sys.executable, "-c", _PICK_FIVE], env=env, capture_output=True, text=True, check=True
    )
    return {int(port) for port in out.stdout.split()}


def test_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10_000 <= port < _ephemeral_start() for port in ports)


def test_a_port_in_use_is_skipped() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert taken not in {free_port() for _ in range(200)}


def test_two_xdist_workers_draw_from_separate_bands() -> None:
    first, second = _ports_in("gw0"), _ports_in("gw1")
    assert len(first) == 5 and len(second) == 5
    assert max(first) < min(second) or max(second) < min(first)

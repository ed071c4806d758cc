"""Is a Docker engine reachable? A cheap answer for deciding whether to skip testcontainers.

Invariants:
- Never takes more than about ``timeout`` seconds (3 by default) and never raises.
- With the default (or a ``unix://``) ``DOCKER_HOST``, a missing socket answers ``False`` at once;
  an existing one must answer ``GET /_ping`` with HTTP 200. Any other ``DOCKER_HOST`` scheme is
  left to ``docker info``, which honours the caller's own TLS and context settings.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

_DEFAULT_HOST = "unix:///var/run/docker.sock"


def _ping_unix_socket(path: str, timeout: float) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(256).split(b"\r\n", 1)[0]
    except OSError:
        return False
    return b" 200 " in status_line + b" "


def _docker_info(timeout: float) -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def docker_available(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers, as testcontainers (docker-py) would look for it."""
    host = os.environ.get("DOCKER_HOST") or _DEFAULT_HOST
    if host.startswith("unix://"):
        path = host.removeprefix("unix://")
        return os.path.exists(path) and _ping_unix_socket(path, timeout)
    return _docker_info(timeout)

"""Free TCP ports on the loopback interface.

Invariants:
- Only 127.0.0.1 is ever bound; the port is released before returning.
- Ports are handed out below the kernel's ephemeral range (`ip_local_port_range`), so no
  outgoing connection and no `bind(("127.0.0.1", 0))` anywhere on the machine can take a port
  between the moment it is picked here and the moment its server binds it.
- Each pytest-xdist worker (`PYTEST_XDIST_WORKER=gwN`) draws from its own band of that range,
  and one process never hands out the same port twice, so two xdist workers never pick the same
  port. A process outside xdist draws from band 0, and a subprocess a test starts from its
  worker's band (it inherits the variable); each process starts at a point drawn from its pid,
  so the few processes sharing a band rarely meet.
- A port some other program holds is skipped (the bind test), so the only race left is with a
  program outside this module binding a fixed port in the band, and a caller must still report
  "address in use" clearly.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from pathlib import Path

_LOWEST = 10_000
_BANDS = 9  # band 0 for a process outside xdist, bands 1..8 for xdist workers gw0..gw7
_FALLBACK_EPHEMERAL_START = 32_768

_lock = threading.Lock()
_handed_out: set[int] = set()
_next_offset = itertools.count()


def _ephemeral_start() -> int:
    """The first port the kernel may pick for itself (Linux's `ip_local_port_range`)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_START


def _band() -> tuple[int, int]:
    """This process's ports: [first, first + size)."""
    size = max((_ephemeral_start() - _LOWEST) // _BANDS, 64)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % (_BANDS - 1) + 1 if worker[2:].isdigit() else 0
    return _LOWEST + index * size, size


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """Return a TCP port on 127.0.0.1, free now, that this module has not handed out before."""
    first, size = _band()
    start = os.getpid() * 7919 % size
    with _lock:
        for _ in range(size):
            port = first + (start + next(_next_offset)) % size
            if port not in _handed_out and _is_free(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # band exhausted
        sock.bind(("127.0.0.1", 0))
        fallback: int = sock.getsockname()[1]
        return fallback

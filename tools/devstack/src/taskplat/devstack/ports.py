"""Free TCP ports on the loopback interface.

Invariants:
- Only 127.0.0.1 is ever bound; the port is released before returning, so a caller that binds
  it later may (rarely) lose a race with another process and must report that clearly.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

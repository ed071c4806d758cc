"""Length-prefixed frames between the service and its sandboxes, over a Unix socket.

Invariants:
  * A frame is a 4-byte big-endian length and that many bytes; a reader names the most it
    accepts and refuses a longer frame before reading it (`FrameError`), so a sandbox cannot make
    the service buffer more than it allows.
  * Reads stop at a deadline (`FrameTimeout`); end of stream mid-frame is `FrameError`.
  * Nothing here unpickles or evaluates: the service reads a sandbox's frames as JSON and bytes.
"""

from __future__ import annotations

import select
import socket
import time

HEADER = 4


class FrameError(Exception):
    """The peer closed the stream or sent a frame over the limit."""


class FrameTimeout(FrameError):
    """No whole frame before the deadline."""


def send(sock: socket.socket, payload: bytes | memoryview) -> None:
    sock.sendall(len(payload).to_bytes(HEADER, "big") + payload)


def send_many(sock: socket.socket, payloads: list[bytes | memoryview]) -> None:
    for payload in payloads:
        sock.sendall(len(payload).to_bytes(HEADER, "big"))
        sock.sendall(payload)


def receive(sock: socket.socket, limit: int, deadline: float | None = None) -> bytes:
    """One frame of at most `limit` bytes; `deadline` is a `time.monotonic()` value."""
    size = int.from_bytes(read_exactly(sock, HEADER, deadline), "big")
    if size > limit:
        raise FrameError(f"a frame of {size} bytes is over the limit of {limit}")
    return read_exactly(sock, size, deadline)


def read_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                raise FrameTimeout("no answer before the deadline")
        chunk = sock.recv(min(size - len(buffer), 1 << 20))
        if not chunk:
            raise FrameError("the stream ended")
        buffer += chunk
    return bytes(buffer)

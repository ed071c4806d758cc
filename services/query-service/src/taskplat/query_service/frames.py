"""Length-prefixed frames between the service and its sandboxes, over a Unix socket.

Invariants:
  * A frame is a 4-byte big-endian length and that many bytes; a reader names the most it
    accepts and refuses a longer frame before reading it (`FrameError`), so a sandbox cannot make
    the service buffer more than it allows.
  * Reads stop at a deadline (`FrameTimeout`), checked before every read; end of stream
    mid-frame is `FrameError`.
  * Frames sent together leave in one `sendmsg` (the peer wakes once); bytes already arrived are
    read without a `select` first.
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
    send_many(sock, [payload])


def send_many(sock: socket.socket, payloads: list[bytes | memoryview]) -> None:
    """The frames in one `sendmsg` (looping only if the socket takes part of them), without
    copying a payload: the peer is woken once, not once per header and payload."""
    parts: list[memoryview] = []
    for payload in payloads:
        parts.append(memoryview(len(payload).to_bytes(HEADER, "big")))
        parts.append(memoryview(payload).cast("B"))
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts.pop(0))
        if sent:
            parts[0] = parts[0][sent:]


def receive(sock: socket.socket, limit: int, deadline: float | None = None) -> bytes:
    """One frame of at most `limit` bytes; `deadline` is a `time.monotonic()` value."""
    size = int.from_bytes(read_exactly(sock, HEADER, deadline), "big")
    if size > limit:
        raise FrameError(f"a frame of {size} bytes is over the limit of {limit}")
    return read_exactly(sock, size, deadline)


def read_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        want = min(size - len(buffer), 1 << 20)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameTimeout("no answer before the deadline")
            try:  # what has arrived already is read without waiting (most often all of it)
                chunk = sock.recv(want, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if not select.select([sock], [], [], left)[0]:
                    raise FrameTimeout("no answer before the deadline") from None
                chunk = sock.recv(want)
        else:
            chunk = sock.recv(want)
        if not chunk:
            raise FrameError("the stream ended")
        buffer += chunk
    return bytes(buffer)

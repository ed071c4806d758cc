"""Follows the services' log files and echoes each new line, prefixed with the service's name.

Invariants:
- Only bytes written after a file was registered are echoed, each complete line once, in file
  order; a partial last line waits for its newline (or for `stop()`, which flushes it).
- The sink is called from this module's one thread only, so it needs no locking of its own.
- A sink or file error never stops the thread: the line is dropped and following continues.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from taskplat.devstack.stack.config import LineSink

_COLORS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")
_POLL_SECONDS = 0.1
_MAX_READ = 1 << 20


@dataclass
class _Followed:
    name: str
    path: Path
    offset: int
    pending: bytes = b""


class LogEcho:
    """A thread that echoes new lines of registered log files as `name | line`."""

    def __init__(self, sink: LineSink, *, color: bool | None = None) -> None:
        self._sink = sink
        self._color = sys.stdout.isatty() if color is None else color
        self._files: dict[str, _Followed] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-log-echo", daemon=True)
        self._width = 10

    def start(self) -> None:
        self._thread.start()

    def follow(self, name: str, path: Path) -> None:
        """Echo what is appended to `path` from now on (idempotent per name)."""
        with self._lock:
            if name in self._files:
                return
            try:
                offset = path.stat().st_size
            except OSError:
                offset = 0
            self._files[name] = _Followed(name, path, offset)
            self._width = max(self._width, len(name))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._poll(flush=True)

    def _prefix(self, name: str, index: int) -> str:
        label = f"{name:<{self._width}} |"
        if not self._color:
            return label
        return f"\033[{_COLORS[index % len(_COLORS)]}m{label}\033[0m"

    def _run(self) -> None:
        while not self._stop.wait(_POLL_SECONDS):
            self._poll()

    def _poll(self, *, flush: bool = False) -> None:
        with self._lock:
            followed = list(self._files.values())
        for index, item in enumerate(followed):
            try:
                with item.path.open("rb") as f:
                    f.seek(item.offset)
                    data = f.read(_MAX_READ)
            except OSError:
                continue
            item.offset += len(data)
            lines = (item.pending + data).split(b"\n")
            item.pending = lines.pop()
            if flush and item.pending:
                lines.append(item.pending)
                item.pending = b""
            prefix = self._prefix(item.name, index)
            for line in lines:
                text = line.decode("utf-8", errors="replace").rstrip("\r")
                try:
                    self._sink(f"{prefix} {text}")
                except Exception:  # a closed or broken stdout must not stop the echo
                    continue

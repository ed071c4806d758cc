"""The operator of `make chaos`, run by the worker wrappers as a script (pooled):

    python <path of this file>

It speaks the wrapper's operator protocol directly (one task JSON line in, one envelope line
out, while stdin stays open), with the standard library only, like the bench's operators.

Invariants:
- For each task it sleeps `config.sleep` seconds (default 0), then appends one line
  `<task_id> <attempt> <start> <end> <pid>` (times: `time.time()`) to the file `config.record`
  with a single `write` on an `O_APPEND` descriptor, so lines of concurrent processes never
  interleave. This file is the operators' own record of what ran: the platform never writes it.
- The line is written before the envelope: a run that answered was recorded; a run killed before
  it answered may or may not have been.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO


def run(task: dict[str, Any]) -> dict[str, Any]:
    config = task.get("config") or {}
    started = time.time()
    pause = float(config.get("sleep", 0))
    if pause > 0:
        time.sleep(pause)
    ended = time.time()
    line = f"{task['task_id']} {task['attempt']} {started:.6f} {ended:.6f} {os.getpid()}\n"
    fd = os.open(str(config["record"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return {"pid": os.getpid()}


def serve(source: TextIO, out: TextIO) -> int:
    for line in source:
        if not line.strip():
            continue
        try:
            envelope = {"status": "succeeded", "payload": run(json.loads(line))}
        except Exception as exc:
            envelope = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(envelope, separators=(",", ":")) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.stdin, sys.stdout))

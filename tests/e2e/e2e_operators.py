"""Operators of the end-to-end tests, run by the worker wrapper as `python -m e2e_operators NAME`
(configured in `e2e_operators.yaml`; `PYTHONPATH` points at this directory).

- `record`: writes its pid to `<config.pid_dir>/<task_id>.<attempt>.pid` (when given), sleeps
  `config.seconds` (default 0), then appends one line `<task_id> <attempt>` to `config.marker`
  (when given) and returns `{"task_id", "attempt"}`. The marker file is the operator's own record
  of its external effect: a task that ran to the end twice shows twice.
- `crash`: writes `config.message` to stderr and exits with status 3 without answering.

Invariants: each marker line is one `write` on a file opened with O_APPEND, so concurrent
operators never interleave lines; the pid file is complete before the sleep starts (written to a
temporary name, then renamed).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from taskplat.worker_wrapper.sdk import Task, serve


def _write_pid(directory: Path, task: Task) -> None:
    final = directory / f"{task.task_id}.{task.attempt}.pid"
    tmp = final.with_suffix(".tmp")
    tmp.write_text(str(os.getpid()))
    tmp.rename(final)


def record(task: Task) -> dict[str, Any]:
    config = task.config
    if config.get("pid_dir"):
        _write_pid(Path(config["pid_dir"]), task)
    seconds = float(config.get("seconds", 0))
    if seconds > 0:
        time.sleep(seconds)
    if config.get("marker"):
        fd = os.open(config["marker"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{task.task_id} {task.attempt}\n".encode())
        finally:
            os.close(fd)
    return {"task_id": task.task_id, "attempt": task.attempt}


def crash(task: Task) -> dict[str, Any]:
    message = str(task.config.get("message", "e2e crash operator: crashing on purpose"))
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os._exit(3)


OPERATORS = {"record": record, "crash": crash}

if __name__ == "__main__":
    raise SystemExit(serve(OPERATORS[sys.argv[1]]))

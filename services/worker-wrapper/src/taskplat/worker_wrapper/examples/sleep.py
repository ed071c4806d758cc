"""`sleep`: sleeps `config.seconds` (default 1), then succeeds."""

from __future__ import annotations

import time
from typing import Any

from taskplat.worker_wrapper.sdk import Task, serve


def handle(task: Task) -> dict[str, Any]:
    seconds = float(task.config.get("seconds", 1))
    time.sleep(max(seconds, 0.0))
    return {"slept": seconds}


if __name__ == "__main__":
    raise SystemExit(serve(handle))

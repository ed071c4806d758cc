"""The benchmark's operators, run by the worker wrappers (see `operators.yaml` beside this file).

    python <path of this file> noop|sleep

They speak the wrapper's operator protocol directly (services/worker-wrapper/README.md): one
task JSON line on stdin, answered by one envelope line on stdout, again and again while stdin
stays open (pooled) or once (per task). It is what `taskplat.worker_wrapper.sdk.serve` does;
the standard library alone keeps the devstack package free of a dependency on the wrapper,
and the wrappers run this file as a script, so an operator process starts in milliseconds.

Invariants:
- Each task's result payload is `{"started": t0, "finished": t1}`: `time.time()` when the
  handler began and ended, taken in the operator process on the machine's clock, so the bench
  can compare them with its own `time.time()` readings.
- `noop` does nothing else; `sleep` sleeps `config.seconds` (default 1) in between.
- Every task line gets exactly one envelope line, flushed at once; a bad line fails its task.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def noop(task: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    return {"started": started, "finished": time.time()}


def sleep(task: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    time.sleep(max(float((task.get("config") or {}).get("seconds", 1)), 0.0))
    return {"started": started, "finished": time.time()}


HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"noop": noop, "sleep": sleep}


def serve(handler: Callable[[dict[str, Any]], dict[str, Any]], source: TextIO, out: TextIO) -> int:
    for line in source:
        if not line.strip():
            continue
        try:
            envelope = {"status": "succeeded", "payload": handler(json.loads(line))}
        except Exception as exc:
            envelope = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(envelope, separators=(",", ":")) + "\n")
        out.flush()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in HANDLERS:
        names = "|".join(HANDLERS)
        print(f"usage: python {__file__} {names}", file=sys.stderr)
        return 2
    return serve(HANDLERS[argv[0]], sys.stdin, sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

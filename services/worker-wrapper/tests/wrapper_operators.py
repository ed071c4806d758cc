"""Test operators of the worker wrapper's tests, run as `{python} wrapper_operators.py <behaviour>`.

Behaviours (the task's `config` tunes some of them):
  env           returns its own environment as the payload
  pid           returns its pid (pooled: `config.action` = crash | hang | fail to misbehave)
  events        emits `config.count` events, then succeeds
  record        appends `task_id attempt` to `config.path`, sleeps `config.seconds`, succeeds
  failed        answers status "failed" with an error
  permanent     answers status "failed" with `"retryable": false`
  crash         writes a long stderr ending in "the real reason", exits 3
  garbage       prints non-JSON lines and exits 0 without an envelope
  bad-envelope  prints an envelope whose payload is not an object
  exit-early    exits 0 at once, reading nothing
  flood-line    writes one very long line, then hangs
  flood-total   writes short lines forever
  hang          emits an event if `config.emit`, starts a grandchild (its pid written to
                `config.pid_file`), then hangs
  stubborn      ignores SIGTERM, then hangs
  trace         returns the trace context it was given: `TRACEPARENT` of its environment and
                `traceparent` of its task line
  steps         step "charge" appends `task_id attempt` to `config.path` (once per task when the
                step result is recorded); fails its first attempt after the step
  publish       publishes `config.count` records (keys `config.prefix` + i, padded to
                `config.pad` characters) to output 0, then succeeds
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from taskplat.worker_wrapper.sdk import Task, emit_event, publish_records, serve, step

DATASET = "00000000-0000-4000-8000-000000000001"
VERSION = "00000000-0000-4000-8000-000000000002"


def _read_task() -> dict[str, Any]:
    line = sys.stdin.readline()
    return dict(json.loads(line))


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _hang() -> None:
    while True:
        time.sleep(60)


def pid(task: Task) -> dict[str, Any]:
    action = task.config.get("action")
    if action == "crash":
        sys.stderr.write("pooled crash\n")
        sys.stderr.flush()
        os._exit(7)
    if action == "hang":
        _hang()
    if action == "fail":
        raise RuntimeError("asked to fail")
    return {"pid": os.getpid(), "task_id": task.task_id}


def events(task: Task) -> dict[str, Any]:
    count = int(task.config.get("count", 3))
    for cursor in range(count):
        emit_event(dataset_uuid=DATASET, dataset_version=VERSION, cursor=cursor)
    return {"emitted": count}


def record(task: Task) -> dict[str, Any]:
    with open(task.config["path"], "a", encoding="utf-8") as out:
        out.write(f"{task.task_id} {task.attempt}\n")
    time.sleep(float(task.config.get("seconds", 0)))
    return {"recorded": True}


def steps(task: Task) -> dict[str, Any]:
    def charge() -> dict[str, Any]:
        with open(task.config["path"], "a", encoding="utf-8") as out:
            out.write(f"{task.task_id} {task.attempt}\n")
        return {"charged_by": task.attempt}

    charged = step("charge", charge)
    if task.attempt == 1:
        raise RuntimeError("failing after the step")
    return {"charge": charged}


def publish(task: Task) -> dict[str, Any]:
    pad = "p" * int(task.config.get("pad", 0))
    records = [
        {"org_id": task.config["org_id"], "dedupe_key": f"{task.config['prefix']}{i}",
         "note": pad}
        for i in range(int(task.config["count"]))
    ]  # fmt: skip
    return {"published": publish_records(0, records)}


def trace(task: Task) -> dict[str, Any]:
    return {
        "env": os.environ.get("TRACEPARENT"),
        "document": task.document.get("traceparent"),
        "sdk": task.traceparent,
    }


def main(behaviour: str) -> int:
    if behaviour == "trace":
        return serve(trace)
    if behaviour == "env":
        return serve(lambda task: {"env": dict(os.environ)})
    if behaviour == "pid":
        return serve(pid)
    if behaviour == "events":
        return serve(events)
    if behaviour == "record":
        return serve(record)
    if behaviour == "steps":
        return serve(steps)
    if behaviour == "publish":
        return serve(publish)
    if behaviour == "exit-early":
        return 0
    task = _read_task()
    if behaviour == "failed":
        _answer({"status": "failed", "error": "nope"})
    elif behaviour == "permanent":
        _answer({"status": "failed", "retryable": False, "error": "never again"})
    elif behaviour == "crash":
        sys.stderr.write("noise " * 2000 + "\nthe real reason\n")
        sys.stderr.flush()
        return 3
    elif behaviour == "garbage":
        print("hello, this is not JSON")
        print("[1, 2, 3]")
        print('{"unrelated": true}')
    elif behaviour == "bad-envelope":
        _answer({"status": "succeeded", "payload": [1, 2]})
    elif behaviour == "flood-line":
        sys.stdout.write("x" * 100_000)
        sys.stdout.flush()
        _hang()
    elif behaviour == "flood-total":
        while True:
            sys.stdout.write("y" * 99 + "\n")
    elif behaviour == "hang":
        if task["config"].get("emit"):
            _answer({"event": {"dataset_uuid": DATASET, "dataset_version": VERSION, "cursor": 1}})
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(task["config"]["pid_file"], "w", encoding="utf-8") as out:
            out.write(f"{child.pid}\n")
        _hang()
    elif behaviour == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(task["config"]["pid_file"], "w", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")
        _hang()
    else:
        sys.stderr.write(f"unknown behaviour {behaviour}\n")
        return 64
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))

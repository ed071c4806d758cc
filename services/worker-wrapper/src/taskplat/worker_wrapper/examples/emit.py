"""`emit`: the example operator of pipelines. Emits each of `config.events` on the job's outputs
(`{output_index, cursor | partition_key/start/end, dataset_version?}`), and with
`config.forward: true` one event on output 0 per input event, at the same position. Returns the
positions it emitted."""

from __future__ import annotations

from typing import Any

from taskplat.worker_wrapper.sdk import Task, emit_event, serve

POSITION_FIELDS = ("cursor", "partition_key", "start", "end")


def handle(task: Task) -> dict[str, Any]:
    emitted: list[dict[str, Any]] = []
    for event in task.config.get("events") or []:
        emitted.append(dict(event))
        emit_event(event)
    if task.config.get("forward"):
        for item in task.inputs:
            position = {key: item[key] for key in POSITION_FIELDS if item.get(key) is not None}
            emitted.append({"output_index": 0, **position})
            emit_event(output_index=0, **position)
    return {"emitted": emitted}


if __name__ == "__main__":
    raise SystemExit(serve(handle))

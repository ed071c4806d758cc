"""`check_task_line(doc)`: whether a document is a task line, the shape the contracts' `TaskLine`
JSON Schema gives it (libs/common/tests/snapshots/TaskLine.json).

Invariants: the required fields are present with their JSON types; the optional ones (and the
nullable `job`, `timeout_seconds`, `deadline_at`) are absent, null or of their type; a job names
`dag_name` and `name`, every output `output_index`, `dataset_uuid`, `dataset_version` and
`location`; other fields are ignored. The TypeScript runtime checks the same table and the Rust
runtime reads the line with serde into its generated type, so the three agree on what a
malformed task line is. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The task line's fields and JSON types, as the contracts' `TaskLine` schema states them (the
# generated Rust and TypeScript types read the same): required, then optional (absent or null).
_REQUIRED: dict[str, type] = {
    "task_id": str,
    "attempt": int,
    "lease_token": str,
    "operator": str,
    "queue": str,
    "config": dict,
    "inputs": list,
}
_OPTIONAL: dict[str, type] = {
    "job": dict,
    "timeout_seconds": int,
    "deadline_at": str,
    "outputs": list,
    "steps": dict,
    "trust": str,
    "traceparent": str,
    "tracestate": str,
}
_OUTPUT_REQUIRED: dict[str, type] = {
    "output_index": int,
    "dataset_uuid": str,
    "dataset_version": str,
    "location": str,
}


def _fields_problem(
    doc: Mapping[str, Any], required: Mapping[str, type], optional: Mapping[str, type], where: str
) -> str | None:
    for name, kind in [*required.items(), *optional.items()]:
        value = doc.get(name)
        if value is None and name in optional:
            continue
        if (
            value is None
            or not isinstance(value, kind)
            or (kind is int and isinstance(value, bool))
        ):
            return f"{where}{name} must be {_JSON_NAMES[kind]}"
    return None


_JSON_NAMES = {str: "a string", int: "an integer", dict: "an object", list: "an array"}


def check_task_line(doc: Any) -> str | None:
    """Why `doc` is not a task line (None when it is one)."""
    if not isinstance(doc, dict):
        return "a task line is a JSON object"
    problem = _fields_problem(doc, _REQUIRED, _OPTIONAL, "")
    if problem is not None:
        return problem
    if doc.get("trust") not in (None, "trusted", "untrusted"):
        return "trust must be trusted or untrusted"
    job = doc.get("job")
    if job is not None:
        problem = _fields_problem(job, {"dag_name": str, "name": str}, {}, "job.")
        if problem is not None:
            return problem
    for index, output in enumerate(doc.get("outputs") or []):
        if not isinstance(output, dict):
            return f"outputs[{index}] must be an object"
        problem = _fields_problem(output, _OUTPUT_REQUIRED, {}, f"outputs[{index}].")
        if problem is not None:
            return problem
    return None

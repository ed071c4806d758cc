"""The Python runtime's task-line check states the contracts' `TaskLine` schema: every property of
the schema is in its tables, a field it requires is one the schema requires and does not allow to be
null, and the JSON types agree. (The Rust runtime reads the line with serde into the type generated
from the same schema; the TypeScript runtime's table is held to it by the shared contract
fixtures.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taskplat.common.contracts import TaskLine
from taskplat.lambda_runtime import task_line

SNAPSHOT = Path(__file__).parents[2] / "libs/common/tests/snapshots/TaskLine.json"
JSON_TYPES = {str: "string", int: "integer", dict: "object", list: "array"}


def _types(prop: dict[str, Any]) -> set[str]:
    if "$ref" in prop:
        return {"object"}
    if "anyOf" in prop:
        return set().union(*(_types(branch) for branch in prop["anyOf"]))
    if "enum" in prop:
        return {"string"}
    return {prop["type"]}


def test_the_task_line_check_states_the_schema() -> None:
    schema = TaskLine.model_json_schema()
    assert json.loads(SNAPSHOT.read_text()) == schema
    properties: dict[str, Any] = schema["properties"]
    tables = {**task_line._REQUIRED, **task_line._OPTIONAL}
    assert set(tables) == set(properties)
    for name, kind in tables.items():
        allowed = _types(properties[name])
        assert JSON_TYPES[kind] in allowed, (name, allowed)
        required = name in schema["required"] and "null" not in allowed
        assert (name in task_line._REQUIRED) == required, name
    output = schema["$defs"]["OutputTarget"]
    assert set(task_line._OUTPUT_REQUIRED) == set(output["required"])

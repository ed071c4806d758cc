"""DAG documents, checked whole before anything is stored: cycles (named), unknown jobs and output
indexes, duplicate names (JSON and YAML), bad cron expressions, unknown fields, conflicting kinds;
the hash ignores the format and key order; event positions are validated by the contract."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from taskplat.common.contracts import Event
from taskplat.common.documents import DocumentLimits, DocumentRefused
from taskplat.common.errors import MalformedJson, ValidationFailed
from taskplat.dispatcher.dag_rules import (
    check_document,
    dataset_plan,
    document_hash,
    find_cycle,
    parse_document,
    upstream_jobs,
)

U1 = "6f1c1b8e-4a57-4b8e-9d1c-1f0b9c2f1a01"
U2 = "0b7d3c1e-5f8a-4e2b-8c6d-2a9e8f7b6c02"


def job(operator: str = "emit", **fields: Any) -> dict[str, Any]:
    return {"operator": operator, **fields}


def out(index: int, dataset: str, **fields: Any) -> dict[str, Any]:
    return {"index": index, "dataset": dataset, **fields}


def from_job(name: str, index: int = 0) -> dict[str, Any]:
    return {"from": {"job": name, "output_index": index}}


PIPELINE = {
    "jobs": {
        "source": job(outputs=[out(0, "blocks")], schedule="*/5 * * * *"),
        "transform": job(inputs=[from_job("source")], outputs=[out(0, "enriched")]),
        "sink": job(inputs=[{"from": {"dataset": "enriched"}, "where": "x > 1"}]),
    }
}


def parsed(doc: Any, content_type: str = "application/json") -> Any:
    body = yaml.safe_dump(doc) if "yaml" in content_type else json.dumps(doc)
    return parse_document(body.encode(), content_type)


def problems(doc: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationFailed) as raised:
        check_document(parsed(doc))
    detail: list[dict[str, Any]] = raised.value.detail
    return detail


def test_a_valid_pipeline_passes_and_hashes_the_same_in_json_and_yaml() -> None:
    as_json = parsed(PIPELINE)
    check_document(as_json)
    as_yaml = parsed(PIPELINE, "application/yaml")
    reordered = parsed({"jobs": dict(reversed(list(PIPELINE["jobs"].items())))})
    assert document_hash(as_json) == document_hash(as_yaml) == document_hash(reordered)
    assert document_hash(as_json).startswith("sha256:")
    plan = {p.name: p.kind for p in dataset_plan(as_json)}
    assert plan == {"blocks": "postgres", "enriched": "postgres"}


def test_a_cycle_is_refused_naming_its_jobs() -> None:
    doc = {
        "jobs": {
            "a": job(inputs=[from_job("c")], outputs=[out(0, "da")]),
            "b": job(inputs=[from_job("a")], outputs=[out(0, "db")]),
            "c": job(inputs=[{"from": {"dataset": "db"}}], outputs=[out(0, "dc")]),
            "free": job(),
        }
    }
    found = problems(doc)
    assert [p["type"] for p in found] == ["cycle"]
    assert found[0]["msg"] == "the jobs form a cycle: a -> c -> b -> a"


def test_a_job_reading_its_own_output_is_a_cycle() -> None:
    doc = {"jobs": {"loop": job(inputs=[from_job("loop")], outputs=[out(0, "d")])}}
    assert "loop -> loop" in problems(doc)[0]["msg"]


def test_find_cycle_on_a_diamond_finds_none() -> None:
    graph = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    assert find_cycle(graph) is None
    assert upstream_jobs(parsed(PIPELINE)) == {"sink": ["transform"], "source": [],
                                                "transform": ["source"]}  # fmt: skip


def test_unknown_jobs_and_output_indexes_are_named() -> None:
    doc = {
        "jobs": {
            "a": job(outputs=[out(0, "da")]),
            "b": job(inputs=[from_job("ghost"), from_job("a", 3)]),
        }
    }
    found = problems(doc)
    assert [p["type"] for p in found] == ["unknown_job", "unknown_output"]
    assert found[0]["loc"] == ["body", "jobs", "b", "inputs", 0, "from"]
    assert "unknown job 'ghost'" in found[0]["msg"]
    assert "job 'a' has no output index 3" in found[1]["msg"]


@pytest.mark.parametrize("expression", ["61 * * * *", "* * * *", "*/5 * * * * *", "nope"])
def test_a_bad_cron_expression_is_refused(expression: str) -> None:
    found = problems({"jobs": {"a": job(schedule=expression)}})
    assert [p["type"] for p in found] == ["invalid_cron"]
    assert expression in found[0]["msg"]


def test_a_job_named_twice_is_refused_in_json_and_in_yaml() -> None:
    body = b'{"jobs": {"a": {"operator": "x"}, "a": {"operator": "y"}}}'
    with pytest.raises(ValidationFailed, match="'a' is given twice"):
        parse_document(body, "application/json")
    text = b"jobs:\n  a: {operator: x}\n  a: {operator: y}\n"
    with pytest.raises(ValidationFailed, match="'a' is given twice"):
        parse_document(text, "application/yaml; charset=utf-8")


def test_unknown_fields_and_malformed_bodies_are_refused() -> None:
    with pytest.raises(ValidationFailed) as raised:
        parsed({"jobs": {"a": job(bogus=1)}})
    assert raised.value.detail[0]["loc"] == ["body", "jobs", "a", "bogus"]
    with pytest.raises(ValidationFailed):
        parsed({"jobs": {}})
    with pytest.raises(ValidationFailed):
        parsed({"jobs": {"bad name": job()}})
    with pytest.raises(ValidationFailed):
        parsed({"jobs": {"a": job(outputs=[out(0, "d"), out(0, "e")])}})
    with pytest.raises(MalformedJson):
        parse_document(b"{", "application/json")
    with pytest.raises(MalformedJson):
        parse_document(b"jobs: [", "application/yaml")
    with pytest.raises(MalformedJson):
        parse_document(b"", "application/json")


def test_a_dataset_given_two_kinds_or_a_schema_off_buffered_is_refused() -> None:
    doc = {
        "jobs": {
            "a": job(outputs=[out(0, "d", kind="s3")]),
            "b": job(
                outputs=[out(0, "d", kind="postgres", schema=[{"name": "x", "type": "text"}])]
            ),
        }
    }
    assert [p["type"] for p in problems(doc)] == ["conflicting_kind", "unexpected_schema"]


def test_event_positions_are_checked_by_the_contract() -> None:
    base = {"dataset_uuid": U1, "dataset_version": U2}
    Event.model_validate({**base, "cursor": 1})
    Event.model_validate({**base, "partition_key": "1-10", "start": 1, "end": 10})
    Event.model_validate({**base, "start": 1, "end": 10})
    Event.model_validate({**base, "partition_key": "2024-01-01"})
    for bad in (
        {},
        {"partition_key": "1-9", "start": 1, "end": 10},
        {"cursor": 1, "start": 1, "end": 2},
        {"start": 1},
    ):
        with pytest.raises(ValidationError):
            Event.model_validate({**base, **bad})


@pytest.mark.parametrize("timeout", [None, 901])
def test_a_lambda_job_states_its_function_timeout(timeout: int | None) -> None:
    fields = {"runtime": "lambda"} | ({"timeout_seconds": timeout} if timeout else {})
    doc = parse_document(json.dumps({"jobs": {"fn": job(**fields)}}).encode(), "application/json")
    with pytest.raises(ValidationFailed) as caught:
        check_document(doc)
    [problem] = caught.value.detail
    assert problem["loc"] == ["body", "jobs", "fn", "timeout_seconds"]
    assert problem["type"] == "lambda_timeout"
    ok = {"jobs": {"fn": job(runtime="lambda", timeout_seconds=900), "w": job(runtime="ecs")}}
    check_document(parse_document(json.dumps(ok).encode(), "application/json"))


def _nested(levels: int) -> Any:
    """A value `levels` containers deep: {"a": [{"a": [...]}]}."""
    value: Any = 0
    for level in range(levels):
        value = [value] if level % 2 else {"a": value}
    return value


@pytest.mark.parametrize("content_type", ["application/json", "application/yaml"])
def test_json_and_yaml_obey_the_same_depth_and_node_limits(content_type: str) -> None:
    """The document itself is 3 containers deep above `config` (document, jobs, the job)."""
    limits = DocumentLimits(max_depth=10, max_nodes=60)

    def doc(config: Any) -> bytes:
        body = {"jobs": {"a": {"operator": "echo", "config": config}}}
        text = yaml.safe_dump(body) if "yaml" in content_type else json.dumps(body)
        return text.encode()

    parse_document(doc({"x": _nested(6)}), content_type, limits)  # 3 + 1 + 6 = 10 levels
    with pytest.raises(DocumentRefused) as deep:
        parse_document(doc({"x": _nested(7)}), content_type, limits)
    assert deep.value.kind == "max_depth" and "10 levels" in deep.value.message
    # Nodes: the document, "jobs", its mapping, "a", the job, "operator", "echo", "config", the
    # config, "x", the list: 11, plus the list's n items.
    parse_document(doc({"x": list(range(49))}), content_type, limits)  # 60 nodes
    with pytest.raises(DocumentRefused) as many:
        parse_document(doc({"x": list(range(50))}), content_type, limits)
    assert many.value.kind == "max_nodes" and "60 nodes" in many.value.message

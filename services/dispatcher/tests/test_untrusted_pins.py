"""Pins of untrusted tasks stay inside their DAG: a `submit` key may pin a task of an untrusted job
only to the datasets the job declares as inputs (any of their versions), so it cannot widen what
the job's capability token grants; anything else is a 422 naming the dataset, unless the key holds
`operate`. A `postgres` dataset's location names its own table only."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from test_access import client, new_key

from taskplat.common.tokens.capability import capability_key_ring, verify_capability_token
from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem
from taskplat.testkit.dispatcher_calls import claim
from taskplat.testkit.dispatcher_harness import Dispatcher

KEY = private_key_pem(b"\x27" * 32)
DAG = {
    "jobs": {
        "ingest": {"operator": "emit", "outputs": [{"index": 0, "dataset": "raw"},
                                                   {"index": 1, "dataset": "secret"}]},
        "udf": {"operator": "udf", "trust": "untrusted",
                "inputs": [{"from": {"dataset": "raw"}}]},
    }
}  # fmt: skip
JOB = {"dag_name": "lake", "name": "udf"}


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    return {
        "capability_token_keys": json.dumps({"c1": KEY}),
        "capability_token_active_kid": "c1",
        "untrusted_operators": "sandboxed",
        "data_bucket": "lake",
    }


def _datasets(d: Dispatcher) -> dict[str, dict[str, Any]]:
    assert d.api.put("/dags/lake", json=DAG).status_code in (200, 201)
    return {each["name"]: each for each in d.api.get("/datasets").json()["datasets"]}


def _pin(dataset: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    return {"dataset_uuid": dataset["dataset_uuid"],
            "dataset_version": version or dataset["current_version"]}  # fmt: skip


def _refused(response: httpx.Response, dataset: dict[str, Any]) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert dataset["dataset_uuid"] in body["message"] and "operate" in body["message"]
    assert [d["type"] for d in body["detail"]] == ["untrusted_pin"]
    assert body["detail"][0]["dataset_uuid"] == dataset["dataset_uuid"]


def test_a_submit_key_pins_an_untrusted_job_to_its_declared_inputs_only(
    dispatcher: Dispatcher,
) -> None:
    d = dispatcher
    found = _datasets(d)
    raw, secret = found["raw"], found["secret"]
    older = raw["current_version"]
    assert d.api.post(f"/datasets/{raw['dataset_uuid']}/versions", json={}).status_code == 201
    submitter = new_key(d, "submitter", "submit", "read")
    with client(d, submitter) as c:
        runs = "/dags/lake/jobs/udf/runs"
        _refused(c.post(runs, json={"inputs": [_pin(secret)]}), secret)
        _refused(c.post("/tasks", json={"operator": "udf", "job": JOB,
                                        "inputs": [_pin(raw), _pin(secret)]}), secret)  # fmt: skip
        batch = {"tasks": [{"operator": "udf", "job": JOB, "inputs": [_pin(secret)]}]}
        _refused(c.post("/tasks/batch", json=batch), secret)
        # An untrusted operator outside any job declares no inputs at all.
        _refused(c.post("/tasks", json={"operator": "sandboxed", "inputs": [_pin(raw)]}), raw)
        assert c.get("/tasks").json()["tasks"] == []  # nothing was written
        # Any version of a declared input is fine, and the token grants exactly that pin.
        run = c.post(runs, json={"inputs": [_pin(raw, older)]})
        assert run.status_code == 201, run.text
        made = c.post("/tasks", json={"operator": "udf", "job": JOB, "inputs": [_pin(raw)]})
        assert made.status_code == 201, made.text
        # A trusted job, or an untrusted task pinning nothing, is not confined.
        trusted = c.post("/tasks", json={"operator": "emit", "job": {"dag_name": "lake",
                                         "name": "ingest"}, "inputs": [_pin(secret)]})  # fmt: skip
        assert trusted.status_code == 201, trusted.text
        assert c.post("/tasks", json={"operator": "sandboxed"}).status_code == 201
    answer = claim(d, run.json()["task_id"]).json()
    ring = capability_key_ring(TokenKeySettings.model_validate({"keys": {"c1": KEY}}))
    capability = verify_capability_token(
        ring, answer["capability_token"], now=d.clock.now()
    ).capability
    assert [(str(i.dataset_uuid), str(i.dataset_version)) for i in capability.inputs] == [
        (raw["dataset_uuid"], older)
    ]


def test_an_operate_key_may_pin_outside_the_dag(dispatcher: Dispatcher) -> None:
    d = dispatcher
    secret = _datasets(d)["secret"]
    operator = new_key(d, "operator", "submit", "operate")
    with client(d, operator) as c:
        run = c.post("/dags/lake/jobs/udf/runs", json={"inputs": [_pin(secret)]})
        assert run.status_code == 201, run.text
        made = c.post("/tasks", json={"operator": "sandboxed", "inputs": [_pin(secret)]})
        assert made.status_code == 201, made.text


@pytest.mark.parametrize(
    "location",
    [
        "postgres_table:dataset_{other}",
        "postgres_table:tasks",
        "postgres_table:api_keys",
        "postgres_table:dataset_",
        'postgres_table:dataset_{dataset_uuid}"; DROP TABLE tasks; --',
    ],
)
def test_a_postgres_location_naming_another_table_is_refused(
    dispatcher: Dispatcher, location: str
) -> None:
    d = dispatcher
    other = _datasets(d)["secret"]["dataset_uuid"]
    doc = {"jobs": {"w": {"operator": "emit", "outputs": [
        {"index": 0, "dataset": "mine", "location": location.format(other=other,
                                                                     dataset_uuid="{dataset_uuid}")}
    ]}}}  # fmt: skip
    response = d.api.put("/dags/sneaky", json=doc)
    assert response.status_code == 422, response.text
    assert [p["type"] for p in response.json()["detail"]] == ["foreign_table"]
    assert "mine" not in {each["name"] for each in d.api.get("/datasets").json()["datasets"]}


def test_a_postgres_location_of_its_own_table_is_accepted(dispatcher: Dispatcher) -> None:
    d = dispatcher
    location = "postgres_table:dataset_{dataset_uuid}_v{dataset_version}"
    doc = {"jobs": {"w": {"operator": "emit", "outputs": [
        {"index": 0, "dataset": "mine", "location": location}]}}}  # fmt: skip
    assert d.api.put("/dags/own", json=doc).status_code == 201
    found = {each["name"]: each for each in d.api.get("/datasets").json()["datasets"]}
    assert found["mine"]["location"] == location

"""The pydantic contracts: every model rejects unknown fields, timestamps without a time zone and
invalid UUIDs; what they accept can be stored; their JSON schemas match committed snapshots."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from taskplat.common import contracts

U1 = "6f1c1b8e-4a57-4b8e-9d1c-1f0b9c2f1a01"
U2 = "0b7d3c1e-5f8a-4e2b-8c6d-2a9e8f7b6c02"
U3 = "c2d4e6f8-1a3b-4c5d-8e7f-9a0b1c2d3e03"
T1 = "2030-01-01T12:00:00Z"
T2 = "2030-01-01T12:00:30+02:00"

JOB = {"dag_name": "monad", "name": "block_follower"}
CLAIM_TASK = {
    "task_id": U1,
    "attempt": 1,
    "job": JOB,
    "operator": "block_follower",
    "queue": "default",
    "config": {"chain": "monad"},
    "inputs": [{"from": "blocks"}],
    "timeout_seconds": 60,
    "deadline_at": T1,
    "outputs": [
        {
            "output_index": 0,
            "dataset_uuid": U2,
            "dataset_version": U3,
            "location": "postgres_table:dataset_x",
        }
    ],
}
EVENT = {"dataset_uuid": U2, "dataset_version": U3, "cursor": 12345}
OUTPUT = {
    "output_index": 0,
    "dataset_uuid": U2,
    "dataset_version": U3,
    "location": "postgres_table:dataset_x",
    "cursor": 12345,
    "row_count": 1000,
}
OUTPUT_VIEW = {**OUTPUT, "attempt": 1, "committed_at": T1}
ATTEMPT_VIEW = {
    "attempt": 1,
    "worker_id": "w",
    "started_at": T1,
    "finished_at": T2,
    "outcome": "Failed",
    "error": "boom",
}
TASK_VIEW = {
    "task_id": U1,
    "status": "Failed",
    "attempt": 1,
    "max_attempts": 3,
    "counted_attempts": 1,
    "processing_attempts": 0,
    "max_processing_attempts": 10,
    "on_exhausted": "dead_letter",
    "operator": "echo",
    "queue": "default",
    "priority": 5,
    "job": JOB,
    "config": {},
    "inputs": [],
    "result": {"rows": 1},
    "last_error": "boom",
    "dead_reason": None,
    "cancel_reason": None,
    "scheduled_for": T1,
    "next_retry_at": T2,
    "expires_at": T2,
    "timeout_seconds": 60,
    "backoff_base_seconds": 1.0,
    "backoff_max_seconds": 300.0,
    "idempotency_key": "k",
    "worker_id": "w",
    "created_at": T1,
    "started_at": T1,
    "finished_at": T2,
    "outputs": [OUTPUT_VIEW],
    "attempts": [ATTEMPT_VIEW],
}

QUEUE_VIEW = {
    "name": "default",
    "paused": True,
    "paused_at": T1,
    "created_at": T1,
    "depth": 3,
    "running": 1,
    "oldest_queued_at": T2,
    "oldest_queued_age_seconds": 12.5,
    "sqs": {"state": "missing", "since": T1, "next_probe_at": T2, "probes": 2},
    "limits": {
        "concurrency_limit": 3,
        "key_concurrency_limit": 1,
        "rate_limit": {"per_second": 10.0, "burst": 5},
    },
    "limits_use": {"running": 1, "keys_at_limit": 1, "tokens_left": 4},
}

# A valid example of every model; each optional UUID or timestamp is set, so each can be broken.
JOB_SPEC = {
    "operator": "transform",
    "runtime": "ecs",
    "queue": "default",
    "config": {"a": 1},
    "schedule": "*/5 * * * *",
    "trust": "untrusted",
    "inputs": [
        {"from": {"job": "source", "output_index": 0}},
        {"from": {"dataset": "alerts"}, "where": "severity = 'critical'"},
    ],
    "outputs": [
        {
            "index": 0,
            "dataset": "enriched",
            "kind": "buffered_postgres",
            "location": None,
            "schema": [{"name": "severity", "type": "text"}],
        }
    ],
    "max_attempts": 3,
    "timeout_seconds": 60,
    "backoff_base_seconds": 1.0,
    "backoff_max_seconds": 30.0,
}
JOB_VIEW = {
    "name": "transform",
    "operator": "transform",
    "runtime": "ecs",
    "queue": "default",
    "config": {},
    "schedule": "0 * * * *",
    "schedule_next_at": T1,
    "trust": "trusted",
    "on_exhausted": "discard",
    "max_attempts": 3,
    "timeout_seconds": None,
    "backoff_base_seconds": 1.0,
    "backoff_max_seconds": 300.0,
    "inputs": [
        {"from": {"dataset": "alerts"}, "where": None, "dataset": "alerts", "dataset_uuid": U2}
    ],
    "outputs": [{"index": 0, "dataset": "enriched", "dataset_uuid": U3, "kind": "postgres"}],
}
DAG_VIEW = {
    "dag_name": "monad",
    "document_hash": "sha256:00",
    "created_at": T1,
    "updated_at": T2,
    "changed": True,
    "jobs": [JOB_VIEW],
}
DAG_SUMMARY = {
    "dag_name": "monad",
    "jobs": 2,
    "document_hash": "sha256:00",
    "created_at": T1,
    "updated_at": T2,
}
EVENT_INPUT = {
    "dataset_uuid": U2,
    "dataset_version": U3,
    "cursor": None,
    "partition_key": "1-10",
    "start": 1,
    "end": 10,
    "where": "x > 1",
}
DATASET_SUMMARY = {
    "dataset_uuid": U2,
    "name": "blocks",
    "kind": "postgres",
    "location": "postgres_table:dataset_{dataset_uuid}",
    "current_version": U3,
    "created_at": T1,
}
DATASET_VERSION = {"dataset_version": U3, "created_at": T1, "superseded_at": T2,
                   "current_since": T2, "became_current": "rollback", "current": True}  # fmt: skip
DATASET_VIEW = {**DATASET_SUMMARY, "latest_cursor": 42, "versions": [DATASET_VERSION]}
EVENT_VIEW = {
    "event_id": 1,
    "dataset_uuid": U2,
    "dataset_version": U3,
    "cursor": 42,
    "partition_key": None,
    "start": None,
    "end": None,
    "producer": {"task_id": U1, "attempt": 1},
    "routed": True,
    "reason": None,
    "tasks": [U1],
    "created_at": T1,
    "routed_at": T2,
}

KEY_VIEW = {"name": "dashboard", "scopes": ["read"], "created_at": T1, "created_by": "bootstrap"}
AUDIT_ENTRY = {
    "audit_id": 42,
    "at": T1,
    "key_name": "ops",
    "action": "cancel_task",
    "target": U1,
    "outcome": "canceled",
    "detail": None,
}
WORKER_REPORT = {
    "worker_id": "w-1",
    "queues": ["default"],
    "slots": 4,
    "version": "0.1.0",
    "running": [U1],
}
WORKER_VIEW = {
    **WORKER_REPORT,
    "first_seen": T1,
    "last_seen": T1,
    "seconds_since_seen": 3.5,
    "state": "alive",
}

TASK_LINE = {
    **CLAIM_TASK,
    "lease_token": U3,
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=1",
}
RESULT_ENVELOPE = {
    "status": "succeeded",
    "payload": {"rows": 1},
    "outputs": [OUTPUT],
    "events": [EVENT],
    "error": None,
    "retryable": None,
}
EXAMPLES: dict[str, dict[str, Any]] = {
    "AttemptView": ATTEMPT_VIEW,
    "ClaimRequest": {"task_id": U1, "worker_id": "ecs:cluster/service/task"},
    "ClaimTask": CLAIM_TASK,
    "TaskLine": TASK_LINE,
    "ResultEnvelope": RESULT_ENVELOPE,
    "ClaimedResponse": {
        "status": "Claimed",
        "attempt": 1,
        "lease_token": U2,
        "lease_expires_at": T1,
        "task": CLAIM_TASK,
        "attempt_token": "header.claims.signature",
    },
    "CompleteRequest": {
        "task_id": U1,
        "attempt": 1,
        "lease_token": U2,
        "status": "Completed",
        "outputs": [OUTPUT],
        "events": [EVENT],
        "error_message": None,
        "result": {"rows": 1},
        "retry_after_seconds": None,
        "reason": None,
        "retryable": True,
    },
    "CompleteResponse": {"status": "Accepted", "task_status": "Completed", "repeated": False},
    "Contract": {},
    "CreateTaskRequest": {
        "operator": "echo",
        "config": {"a": 1},
        "inputs": [1, "two"],
        "queue": "fast",
        "max_attempts": 5,
        "timeout_seconds": 30,
        "backoff_base_seconds": 1,
        "backoff_max_seconds": 60,
        "scheduled_for": T1,
        "expires_at": T2,
        "idempotency_key": "k",
        "job": JOB,
        "priority": 0,
    },
    "DeadLetterRecord": {
        "record": "resolved",
        "task_id": U1,
        "queue": "default",
        "operator": "echo",
        "attempt": 3,
        "max_attempts": 3,
        "dead_reason": "AttemptsExhausted",
        "last_error": "boom",
        "died_at": T1,
        "resolved_at": T1,
    },
    "ErrorResponse": {"error": "not_found", "message": "no such task", "detail": None},
    "Event": EVENT,
    "EventsAcceptedResponse": {"status": "Accepted", "accepted": 1},
    "EventsRequest": {"task_id": U1, "attempt": 1, "lease_token": U2, "events": [EVENT]},
    "StepRequest": {"task_id": U1, "attempt": 1, "lease_token": U2, "step": "charge",
                    "result": {"charge_id": "ch_1"}},
    "StepResponse": {"status": "Existing", "result": [1, "two"], "attempt": 1},
    "ColumnView": {"name": "severity", "type": "text"},
    "FetchResponse": {"status": "Running", "task": CLAIM_TASK},
    "HeartbeatRequest": {"task_id": U1, "attempt": 1, "lease_token": U2, "worker": WORKER_REPORT},
    "HeartbeatResponse": {"status": "Ok", "lease_expires_at": T1},
    "JobRef": JOB,
    "NotClaimedResponse": {"status": "NotClaimed", "reason": "AlreadyRunning"},
    "CredentialsRequest": {},
    "CredentialsResponse": {
        "access_key_id": "ASIA",
        "secret_access_key": "s",
        "session_token": "t",
        "expiration": T1,
        "usable_until": T1,
        "task_id": U1,
        "attempt": 1,
        "read_prefixes": ["s3://lake/dataset/a/version/b/"],
        "write_prefixes": ["s3://lake/scratch/t/1/"],
        "policy": {"Version": "2012-10-17", "Statement": []},
    },
    "Output": OUTPUT,
    "OutputView": OUTPUT_VIEW,
    "RejectedResponse": {"status": "Rejected", "reason": "StaleLease", "message": "m"},
    "TaskList": {"tasks": [TASK_VIEW], "next_cursor": "abc"},
    "TaskView": TASK_VIEW,
    "WakeUpMessage": {"task_id": U1},
    # The batch contracts of the performance work.
    "ClaimBatchRequest": {"worker_id": "w", "task_ids": [U1, U2]},
    "ClaimBatchResponse": {
        "claimed": [
            {"status": "Claimed", "attempt": 1, "lease_token": U2, "lease_expires_at": T1,
             "task": CLAIM_TASK, "attempt_token": "h.c.s"},
        ],
        "not_claimed": [{"task_id": U2, "reason": "AlreadyRunning"}],
    },
    "ClaimNextRequest": {"worker_id": "w", "queue": "default", "max": 10,
                         "worker": WORKER_REPORT},
    "ClaimNextResponse": {
        "claimed": [
            {"status": "Claimed", "attempt": 1, "lease_token": U2, "lease_expires_at": T1,
             "task": CLAIM_TASK, "attempt_token": "h.c.s"}
        ],
        "not_claimed": [{"task_id": U1, "reason": "MissingCapabilityKeys",
                         "detail": "TASKPLAT_CAPABILITY_TOKEN_KEYS is not set"}],
    },
    "CompleteBatchRequest": {
        "completions": [
            {"task_id": U1, "attempt": 1, "lease_token": U2, "status": "Completed",
             "outputs": [OUTPUT], "events": [EVENT], "error_message": None, "result": {"rows": 1},
             "retry_after_seconds": None}
        ],
        "claim_next": {"worker_id": "w", "queue": "default", "max": 10, "worker": WORKER_REPORT},
    },
    "CompleteBatchResult": {
        "task_id": U1,
        "status_code": 409,
        "body": {"status": "Rejected", "reason": "StaleLease", "message": "m"},
    },
    "CompleteBatchResponse": {
        "results": [
            {"task_id": U1, "status_code": 200,
             "body": {"status": "Accepted", "task_status": "Completed", "repeated": False}},
        ],
        "claimed": [
            {"status": "Claimed", "attempt": 1, "lease_token": U2, "lease_expires_at": T1,
             "task": CLAIM_TASK, "attempt_token": "h.c.s"}
        ],
    },
    "CreateTasksRequest": {
        "tasks": [
            {"operator": "echo", "config": {"a": 1}, "inputs": [1, "two"], "queue": "fast",
             "max_attempts": 5, "timeout_seconds": 30, "backoff_base_seconds": 1,
             "backoff_max_seconds": 60, "scheduled_for": T1, "expires_at": T2,
             "idempotency_key": "k", "job": JOB}
        ]
    },
    "CreatedTask": {"created": True, "task": TASK_VIEW},
    "CreateTasksResponse": {"results": [{"created": False, "task": TASK_VIEW}]},
    "NotClaimedItem": {"task_id": U1, "reason": "NotFound"},
    "OutputTarget": {"output_index": 0, "dataset_uuid": U2, "dataset_version": U3,
                     "location": "postgres_table:dataset_x"},
    "JobSpec": JOB_SPEC,
    "DagDocument": {"jobs": {"transform": JOB_SPEC, "source": {"operator": "emit"}}},
    "DagView": DAG_VIEW,
    "DagSummary": DAG_SUMMARY,
    "DagList": {"dags": [DAG_SUMMARY]},
    "DeletedDag": {"dag_name": "monad", "deleted": True},
    "JobView": JOB_VIEW,
    "JobRunRequest": {"config": {"a": 1}, "inputs": [EVENT_INPUT], "idempotency_key": "k"},
    "EventInput": EVENT_INPUT,
    "DatasetSummary": DATASET_SUMMARY,
    "DatasetList": {"datasets": [DATASET_SUMMARY]},
    "DatasetVersionView": DATASET_VERSION,
    "DatasetView": DATASET_VIEW,
    "NewVersionRequest": {},
    "CurrentVersionRequest": {"dataset_version": U3},
    "NewVersionResponse": {"dataset": DATASET_VIEW, "canceled_tasks": 2},
    "EventView": EVENT_VIEW,
    "EventList": {"events": [EVENT_VIEW], "next_cursor": "ZTE"},
    "ColumnSpec": {"name": "severity", "type": "text"},
    "FromJob": {"job": "source", "output_index": 0},
    "FromDataset": {"dataset": "alerts"},
    "InputSpec": {"from": {"dataset": "alerts"}, "where": "severity = 'critical'"},
    "OutputSpec": {"index": 0, "dataset": "blocks", "kind": "s3", "location": "s3://b/{dataset_uuid}/",
                   "schema": None},
    "ResolvedInput": JOB_VIEW["inputs"][0],
    "ResolvedOutput": JOB_VIEW["outputs"][0],
    "Producer": {"task_id": U1, "attempt": 1},
    # The operators' routes: queues, bulk replay and the dashboard's figures.
    "QueueView": QUEUE_VIEW,
    "QueueSqsState": QUEUE_VIEW["sqs"],
    "QueueLimits": QUEUE_VIEW["limits"],
    "QueueLimitsUse": QUEUE_VIEW["limits_use"],
    "RateLimit": {"per_second": 10.0, "burst": 5},
    "QueueList": {"queues": [QUEUE_VIEW]},
    "BulkRetryRequest": {"ids": [U1, U2]},
    "BulkRetrySkipped": {"task_id": U1, "reason": "NotReplayable"},
    "RetryRequest": {"repin": True},
    "BulkRetryResponse": {"replayed": [U1], "skipped": [{"task_id": U2, "reason": "NotFound"}]},
    "StateCount": {"queue": "default", "status": "Queued", "tasks": 3},
    "ThroughputBucket": {"minute": T1, "completed": 10, "dead": 1},
    "Stats": {"generated_at": T1, "counts": [{"queue": "default", "status": "Dead", "tasks": 1}],
              "throughput": [{"minute": T1, "completed": 10, "dead": 1}]},
    "KeyCreateRequest": {"name": "dashboard", "scopes": ["read"]},
    "KeyCreated": {"name": "dashboard", "scopes": ["read"], "created_at": T1, "key": "tpk_x"},
    "KeyView": KEY_VIEW,
    "KeyList": {"keys": [KEY_VIEW]},
    "RevokedKey": {"name": "dashboard", "revoked": True},
    "AuditEntry": AUDIT_ENTRY,
    "AuditList": {"entries": [AUDIT_ENTRY], "next_cursor": "41"},
    "WorkerReport": WORKER_REPORT,
    "WorkerView": WORKER_VIEW,
    "WorkerList": {"workers": [WORKER_VIEW], "lost_after_seconds": 60.0},
}  # fmt: skip

MODELS: dict[str, type[BaseModel]] = {
    name: getattr(contracts, name)
    for name in contracts.__all__
    if isinstance(getattr(contracts, name), type)
    and issubclass(getattr(contracts, name), BaseModel)
}
ALIASES = sorted(set(contracts.__all__) - set(MODELS))

Location = tuple[str | int, ...]


def test_every_model_has_an_example() -> None:
    assert set(MODELS) == set(EXAMPLES)
    assert ALIASES == [
        "AttemptOutcome", "CompletionStatus", "FailureReason", "NotClaimedReason", "OnExhausted",
        "RejectReason",
        "TaskStatus",
    ]  # fmt: skip


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_example_is_valid_and_round_trips(name: str) -> None:
    model = MODELS[name]
    parsed = model.model_validate_json(json.dumps(EXAMPLES[name]))
    assert model.model_validate_json(parsed.model_dump_json()) == parsed
    assert model.model_config.get("extra") == "forbid"
    assert model.model_config.get("frozen") is True


def _formatted_paths(
    schema: dict[str, Any], defs: dict[str, Any], path: Location
) -> Iterator[tuple[Location, str]]:
    """Every (path, format) of a uuid or date-time string the schema can contain."""
    if "$ref" in schema:
        yield from _formatted_paths(defs[schema["$ref"].split("/")[-1]], defs, path)
        return
    if schema.get("format") in ("uuid", "date-time"):
        yield path, schema["format"]
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []):
        yield from _formatted_paths(branch, defs, path)
    for key, prop in schema.get("properties", {}).items():
        yield from _formatted_paths(prop, defs, (*path, key))
    if isinstance(schema.get("items"), dict):
        yield from _formatted_paths(schema["items"], defs, (*path, 0))


def _with(example: dict[str, Any], path: Location, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(example)
    target: Any = changed
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return changed


def _at(example: dict[str, Any], path: Location) -> Any:
    value: Any = example
    for step in path:
        value = value[step]
    return value


def _rejected(model: type[BaseModel], data: Any) -> list[Any]:
    with pytest.raises(ValidationError) as raised:
        model.model_validate_json(json.dumps(data))
    return [error["loc"] for error in raised.value.errors()]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_unknown_fields_are_rejected(name: str) -> None:
    model = MODELS[name]
    assert _rejected(model, {**EXAMPLES[name], "unexpected": 1}) == [("unexpected",)]
    # ... and in python mode too (a service building a model by mistake).
    with pytest.raises(ValidationError):
        model.model_validate({**EXAMPLES[name], "unexpected": 1})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_naive_timestamps_and_invalid_uuids_are_rejected(name: str) -> None:
    model = MODELS[name]
    schema = model.model_json_schema()
    paths = sorted(set(_formatted_paths(schema, schema.get("$defs", {}), ())), key=str)
    for path, fmt in paths:
        assert _at(EXAMPLES[name], path) is not None, f"the example of {name} lacks {path}"
        if fmt == "uuid":
            bad_values: list[Any] = ["not-a-uuid", "6f1c1b8e-4a57-4b8e-9d1c", 12]
        else:
            bad_values = ["2030-01-01T12:00:00", "2030-01-01 12:00:00", "2030-01-01", "soon"]
        for bad in bad_values:
            locations = _rejected(model, _with(EXAMPLES[name], path, bad))
            assert any(loc[: len(path)] == path for loc in locations), (path, bad, locations)


def test_contracts_refuse_what_postgres_cannot_store() -> None:
    """NaN/Infinity and NUL characters in free JSON and text, integers beyond bigint."""
    request = EXAMPLES["CompleteRequest"]
    create = EXAMPLES["CreateTaskRequest"]
    for raw in (
        '{"operator": "echo", "config": {"a": NaN}}',
        '{"operator": "echo", "config": {"a": [1, Infinity]}}',
        '{"operator": "echo", "inputs": [{"x": -Infinity}]}',
        '{"operator": "echo", "inputs": [1e400]}',
    ):
        with pytest.raises(ValidationError):
            contracts.CreateTaskRequest.model_validate_json(raw)
    cases: list[tuple[type[BaseModel], dict[str, Any]]] = [
        (contracts.CreateTaskRequest, {**create, "config": {"a": "x\u0000"}}),
        (contracts.CreateTaskRequest, {**create, "config": {"k\u0000": 1}}),
        (contracts.CreateTaskRequest, {**create, "inputs": [["\u0000"]]}),
        (contracts.CreateTaskRequest, {**create, "idempotency_key": "\u0000"}),
        (contracts.CreateTaskRequest, {**create, "job": {**JOB, "name": "a\u0000"}}),
        (contracts.ClaimRequest, {"task_id": U1, "worker_id": "w\u0000"}),
        (contracts.CompleteRequest, {**request, "error_message": "\u0000"}),
        (contracts.CompleteRequest, {**request, "result": {"a": {"b": "\u0000"}}}),
        (contracts.CompleteRequest, {**request, "outputs": [{**OUTPUT, "location": "\u0000"}]}),
        (contracts.CompleteRequest, {**request, "outputs": [{**OUTPUT, "cursor": 2**63}]}),
        (contracts.CompleteRequest, {**request, "outputs": [{**OUTPUT, "row_count": 2**63}]}),
        (contracts.Event, {**EVENT, "cursor": 2**63}),
        (contracts.Event, {**EVENT, "cursor": -(2**63) - 1}),
        (contracts.Event, {**EVENT, "cursor": None, "partition_key": "\u0000"}),
        (
            contracts.Event,
            {**EVENT, "cursor": None, "partition_key": "p", "start": 0, "end": 2**63},
        ),
    ]
    for model, data in cases:
        with pytest.raises(ValidationError):
            model.model_validate_json(json.dumps(data))
    # The edges of bigint are fine.
    contracts.Event.model_validate({**EVENT, "cursor": 2**63 - 1})
    contracts.Event.model_validate({**EVENT, "cursor": -(2**63)})


def test_contract_rules_of_the_internal_api() -> None:
    event = contracts.Event
    with pytest.raises(ValidationError, match="either a cursor or a partition"):
        event.model_validate({**EVENT, "partition_key": "1-2", "start": 1, "end": 2})
    with pytest.raises(ValidationError, match="start and end go together"):
        event.model_validate({**EVENT, "cursor": None, "start": 1})
    with pytest.raises(ValidationError, match="start must not exceed end"):
        event.model_validate({**EVENT, "cursor": None, "partition_key": "p", "start": 2, "end": 1})
    request = EXAMPLES["CompleteRequest"]
    with pytest.raises(ValidationError, match="distinct output_index"):
        contracts.CompleteRequest.model_validate({**request, "outputs": [OUTPUT, OUTPUT]})
    for bad in ({"max_attempts": 0}, {"max_attempts": 101}, {"timeout_seconds": 0}):
        with pytest.raises(ValidationError):
            contracts.CreateTaskRequest.model_validate({"operator": "echo", **bad})
    for good in ({"max_attempts": 1}, {"max_attempts": 100}):
        contracts.CreateTaskRequest.model_validate({"operator": "echo", **good})


def _json_schema(name: str) -> dict[str, Any]:
    if name in MODELS:
        return MODELS[name].model_json_schema()
    schema: dict[str, Any] = TypeAdapter(getattr(contracts, name)).json_schema()
    return schema


@pytest.mark.parametrize("name", sorted(contracts.__all__))
def test_json_schema_matches_its_snapshot(name: str, snapshot: Callable[[str, Any], None]) -> None:
    snapshot(name, _json_schema(name))


def test_every_contract_snapshot_names_a_contract() -> None:
    snapshots = Path(__file__).with_name("snapshots")
    stale = {path.stem for path in snapshots.glob("*.json")} - set(contracts.__all__)
    assert stale <= {"db_schema"}, f"snapshots of contracts that no longer exist: {stale}"


def test_queue_names_that_would_collide_with_dead_letter_queues_are_refused() -> None:
    from pydantic import ValidationError

    from taskplat.common.contracts import CreateTaskRequest

    for queue in ("dead-letters", "default-dlq", "x-dlq"):
        with pytest.raises(ValidationError, match="reserved"):
            CreateTaskRequest(operator="echo", queue=queue)
    assert CreateTaskRequest(operator="echo", queue="dlq-reports").queue == "dlq-reports"

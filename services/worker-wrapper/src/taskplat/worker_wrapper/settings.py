"""Settings of the worker wrapper (env prefix `TASKPLAT_WORKER_`, plus the shared names).

Invariants: the worker token is a secret (never printed, never passed to an operator); every default
is a production-sensible value; the visibility extension interval is shorter than the visibility
timeout it extends, so a running task's message never becomes visible while it runs; the stall
limit of `/healthz` exceeds the long-poll wait (an idle wrapper polls at least that often).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal, Self

from pydantic import AliasChoices, Field, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict

from taskplat.common.contracts.base import QueueName, WorkerId
from taskplat.common.ops_server import OpsSettings
from taskplat.common.settings import ServiceSettings, SqsSettings, WorkerTokenSettings
from taskplat.common.telemetry import TelemetrySettings

MIB = 1024 * 1024


def default_worker_id() -> str:
    """`<hostname>:<pid>`: unique among the wrappers running at one time."""
    return f"{socket.gethostname()}:{os.getpid()}"


class WrapperSettings(
    ServiceSettings, SqsSettings, WorkerTokenSettings, TelemetrySettings, OpsSettings
):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_WORKER_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    dispatcher_url: str = Field(
        pattern=r"^https?://\S+$",
        description="Base URL of the dispatcher, e.g. `http://dispatcher:8080`.",
    )
    queue: QueueName = Field(
        "default",
        description="Task queue this wrapper serves "
        "(SQS queue = `TASKPLAT_SQS_QUEUE_PREFIX` + queue).",
    )
    concurrency: int = Field(4, ge=1, le=256, description="Tasks run at once by this wrapper.")
    worker_id: WorkerId = Field(
        default_factory=default_worker_id,
        validation_alias=AliasChoices("TASKPLAT_WORKER_ID", "worker_id"),
        description="Identity recorded on each claimed attempt (`TASKPLAT_WORKER_ID`); "
        "default `<hostname>:<pid>`.",
    )
    operators_file: Path | None = Field(
        None,
        description="YAML file configuring the operators by name; default: the `operators.yaml` "
        "shipped in the package (the example operators).",
    )
    wait_time_seconds: int = Field(
        20, ge=0, le=20, description="SQS long-poll wait (`WaitTimeSeconds`) of each receive."
    )
    visibility_timeout_seconds: int = Field(
        60,
        ge=2,
        le=43_200,
        description="Visibility timeout set on received messages and renewed while a task runs.",
    )
    receive_visibility_timeout_seconds: int = Field(
        1,
        ge=1,
        le=43_200,
        description="Visibility timeout a receive sets: short, so a wake-up a dead wrapper's "
        "long poll took comes back within seconds; renewed to `visibility_timeout_seconds` once "
        "its task has run for half of it.",
    )
    visibility_extension_seconds: float = Field(
        20.0,
        gt=0,
        description="How often a running task's message visibility is renewed.",
    )
    heartbeat_fraction: float = Field(
        1 / 3,
        gt=0,
        lt=1,
        description="Heartbeat after this fraction of the time left on the lease.",
    )
    heartbeat_min_interval_seconds: float = Field(
        0.5, gt=0, description="Floor of the interval between two heartbeats."
    )
    drain_timeout_seconds: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM/SIGINT, how long running tasks may finish before they are killed "
        "and reported Failed for an immediate retry.",
    )
    shutdown_report_timeout_seconds: float = Field(
        15.0,
        gt=0,
        description="After the drain, how long the reports of killed tasks may take before exit.",
    )
    kill_grace_seconds: float = Field(
        3.0,
        ge=0,
        description="Between SIGTERM and SIGKILL when an operator's process group is killed.",
    )
    stdout_line_max_bytes: int = Field(
        1 * MIB,
        ge=1024,
        description="Longest stdout line an operator may write; a longer one kills it "
        "(stdout flood).",
    )
    stdout_max_bytes: int = Field(
        64 * MIB,
        ge=1024,
        description="Most stdout bytes an operator may write for one task; more kills it "
        "(stdout flood).",
    )
    stderr_tail_bytes: int = Field(
        4096,
        ge=0,
        le=12_288,
        description="How much of the end of an operator's stderr a failure's error message keeps.",
    )
    http_timeout_seconds: float = Field(
        10.0, gt=0, description="Timeout of one dispatcher call (read, write, pool)."
    )
    http_connect_timeout_seconds: float = Field(
        5.0, gt=0, description="Connect timeout of one dispatcher call."
    )
    retry_base_seconds: float = Field(
        0.2, gt=0, description="Backoff base of retried dispatcher and SQS calls (full jitter)."
    )
    retry_max_seconds: float = Field(
        5.0, gt=0, description="Backoff cap of retried dispatcher and SQS calls."
    )
    claim_retry_seconds: float = Field(
        30.0,
        gt=0,
        description="How long a claim is retried on network errors and 5xx before the message "
        "is left for SQS to redeliver.",
    )
    complete_retry_min_seconds: float = Field(
        10.0,
        gt=0,
        description="Calls for a running task are retried until its lease expires, and at "
        "least this long.",
    )

    operator_user: str | None = Field(
        "taskplat-operator",
        description="Unprivileged user that untrusted operators run as, when the wrapper can "
        "switch users (root, or CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_CHOWN); empty: never "
        "switch.",
    )
    scratch_dir: Path = Field(
        Path("/tmp/taskplat-scratch"),
        description="Where each untrusted task gets its own scratch directory (mode 0700, owned "
        "by the operator user, removed when the task ends; the operator's HOME, TMPDIR and cwd).",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="The wrapper's event loop: `auto` takes uvloop when it is installed, else "
        "asyncio.",
    )
    claim_ahead: bool = Field(
        True,
        description="Under a backlog (a receive came back full), claim further Queued tasks of "
        "the queue straight from the dispatcher (`task-claim-next`) while slots are free, "
        "instead of waiting for their wake-ups; an idle wrapper still long-polls SQS. Only "
        "without `poll_dispatcher`, whose waiting claim fills free slots the same way (set to "
        "true beside it, the wrapper refuses to start).",
    )
    poll_dispatcher: bool = Field(
        True,
        description="While slots are free, keep one `task-claim-next` open on the dispatcher "
        "that waits up to `poll_wait_seconds` for a task of the queue: a new task is claimed for "
        "this wrapper as soon as it is created, with no SQS message in between (its wake-up is "
        "sent later only if nobody claimed it). SQS is long-polled beside it, as always.",
    )
    report_interval_seconds: float = Field(
        10.0,
        ge=0,
        le=600,
        description="How often the wrapper reports itself (worker id, queue, slots, version, "
        "running tasks) to the dispatcher, on a `task-claim-next` or heartbeat it makes anyway, "
        "for `GET /workers` (0: never). An idle wrapper is seen through its waiting claim "
        "(`poll_dispatcher`); one that makes no call for `worker_lost_seconds` shows as lost.",
    )
    poll_wait_seconds: float = Field(
        10.0,
        gt=0,
        le=60,
        description="How long one waiting `task-claim-next` waits (the dispatcher may cut it "
        "to its `claim_max_wait_seconds`); a stopping wrapper cancels the open one at once.",
    )
    report_in_background: bool = Field(
        True,
        description="A task's slot is free once its operator has exited: its completion is "
        "reported (and its lease kept) in the background while the slot runs the next task. At "
        "most `concurrency` reports run in the background; beyond that they hold their slots.",
    )
    batch_calls: bool = Field(
        True,
        description="Batch dispatcher and SQS calls under load: the claims of one receive "
        "(`task-claim-batch`), completions (`task-complete-batch`) and message deletions "
        "(DeleteMessageBatch), up to 10 per call.",
    )
    delete_linger_seconds: float = Field(
        0.3,
        ge=0,
        le=1,
        description="With `batch_calls`: how long a message deletion waits for others to fill a "
        "DeleteMessageBatch (10 go at once). Deletions run after the task's slot is free; at "
        "most half of `receive_visibility_timeout_seconds`.",
    )
    complete_linger_seconds: float = Field(
        0.01,
        ge=0,
        le=1,
        description="With `batch_calls`: how long a completion waits for the wrapper's other "
        "running tasks to complete too, so one `task-complete-batch` call carries them; it goes "
        "at once when every running task has completed (a lone task never waits).",
    )
    claim_with_completions: bool = Field(
        True,
        description="With `batch_calls` and `poll_dispatcher`: under a backlog, the claim of the "
        "next tasks goes along with the completion call about to be sent (one "
        "`task-complete-batch` carrying `claim_next`: one request and one transaction) instead "
        "of a `task-claim-next` of its own (set to true without both, the wrapper refuses to "
        "start).",
    )
    parallel_calls: int = Field(
        4,
        ge=1,
        le=10,
        description="With `batch_calls`: completion calls and SQS deletion requests in flight at "
        "once (those ready meanwhile wait, and go together when one returns; those ready in the "
        "same event-loop turn always go together); the claims of a receive that brought more "
        "wake-ups than this go in one batch call.",
    )

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.receive_visibility_timeout_seconds > self.visibility_timeout_seconds:
            raise ValueError(
                "receive_visibility_timeout_seconds must not exceed visibility_timeout_seconds"
            )
        if self.delete_linger_seconds * 2 > self.receive_visibility_timeout_seconds:
            # A message whose deletion lingers is not renewed: it must go well before it shows.
            raise ValueError(
                "delete_linger_seconds must be at most half of receive_visibility_timeout_seconds"
            )
        if self.visibility_extension_seconds >= self.visibility_timeout_seconds:
            raise ValueError(
                "visibility_extension_seconds must be shorter than visibility_timeout_seconds"
            )
        if self.retry_base_seconds > self.retry_max_seconds:
            raise ValueError("retry_base_seconds must not exceed retry_max_seconds")
        if self.stall_seconds <= self.wait_time_seconds:
            raise ValueError("stall_seconds must exceed wait_time_seconds")
        self._one_way_of_getting_work()
        return self

    def _one_way_of_getting_work(self) -> None:
        """A flag set for a way of getting work the wrapper does not take is refused, never
        ignored: the SQS receive (always), with claim-ahead only without the waiting claim
        (`poll_dispatcher`, which fills free slots itself), with claims along completions only
        with the waiting claim and batched calls; the batching tunables only with
        `batch_calls`. A default that does not apply is not an error."""
        chosen = self.model_fields_set
        if "claim_ahead" in chosen and self.claim_ahead and self.poll_dispatcher:
            raise ValueError(
                "claim_ahead applies only with poll_dispatcher false (the waiting claim fills "
                "free slots itself): set TASKPLAT_WORKER_POLL_DISPATCHER=false or leave "
                "TASKPLAT_WORKER_CLAIM_AHEAD unset"
            )
        if "claim_with_completions" in chosen and self.claim_with_completions:
            if not (self.poll_dispatcher and self.batch_calls):
                raise ValueError(
                    "claim_with_completions needs poll_dispatcher and batch_calls (a claim goes "
                    "along a batched completion of a wrapper that waits on the dispatcher)"
                )
        batching = sorted(
            chosen & {"delete_linger_seconds", "complete_linger_seconds", "parallel_calls"}
        )
        if batching and not self.batch_calls:
            raise ValueError(
                f"{', '.join(batching)} apply only with batch_calls (TASKPLAT_WORKER_BATCH_CALLS)"
            )


def describe_settings_error(exc: ValidationError) -> str:
    """A one-line summary naming the environment variables at fault."""
    parts = []
    for error in exc.errors()[:3]:
        loc = [str(item) for item in error["loc"]]
        name = loc[0] if loc else "(settings)"
        field = WrapperSettings.model_fields.get(name)
        if field is not None and field.validation_alias is None:
            name = f"TASKPLAT_WORKER_{name.upper()}"
        parts.append(f"{'.'.join([name, *loc[1:]])}: {error['msg']}")
    if exc.error_count() > 3:
        parts.append(f"and {exc.error_count() - 3} more")
    return "; ".join(parts)

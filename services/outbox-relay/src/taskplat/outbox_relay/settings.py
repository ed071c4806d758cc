"""Settings of the outbox relay (env prefix `TASKPLAT_RELAY_`, plus the shared names).

Invariants: read once in `__main__` (or a test) and passed down; every default is a
production-sensible value; a batch is bounded (`batch_size`), so one transaction never holds more
than `batch_size` outbox row locks. `/metrics` and `/healthz` are served only when
`TASKPLAT_RELAY_OPS_PORT` is set; traces are exported only with `OTEL_EXPORTER_OTLP_ENDPOINT`.
Lambda invocations (`invoke_lambda` rows) sign attempt tokens with the dispatcher's keys
(`TASKPLAT_ATTEMPT_TOKEN_KEYS`, `TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID`); without them such rows are
never invoked and carry that error (`attempt_token_key_settings` is None). An untrusted Lambda
job's invocation also carries its capability token, signed with the dispatcher's capability keys
(`TASKPLAT_CAPABILITY_TOKEN_KEYS`, `TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID`, `TASKPLAT_DATA_BUCKET`);
without them such a job is never invoked either.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from taskplat.common.ops_server import OpsSettings
from taskplat.common.settings import (
    AttemptTokenSettings,
    CapabilityTokenSettings,
    DatabaseSettings,
    ServiceSettings,
    SqsSettings,
    WakeupHoldSettings,
)
from taskplat.common.telemetry import TelemetrySettings
from taskplat.common.tokens.keys import TokenKeySettings, key_settings

# A queue counts as claimed ahead for this long after a full claim-next (migration 0013); the
# dispatcher stamps it at most once a second while its workers drain a backlog.
HOLD_EVIDENCE_SECONDS = 2.0


class RelaySettings(
    ServiceSettings,
    DatabaseSettings,
    SqsSettings,
    TelemetrySettings,
    OpsSettings,
    AttemptTokenSettings,
    CapabilityTokenSettings,
    WakeupHoldSettings,
):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_RELAY_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    batch_size: int = Field(
        100, ge=1, le=1000, description="Outbox rows claimed (and locked) per batch."
    )
    interval_seconds: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="Longest wait between batches when no NOTIFY arrives (the fallback poll).",
    )
    loops: int = Field(
        2,
        ge=1,
        le=16,
        description="Relay loops in this process, each its own batch transaction (SKIP LOCKED "
        "keeps them apart, as replicas): a new row need not wait for the batch in flight.",
    )
    send_concurrency: int = Field(
        4, ge=1, le=32, description="SendMessageBatch calls of one batch run in parallel."
    )
    skip_not_queued: bool = Field(
        True,
        description=(
            "Mark a wake-up sent without sending it when its task is no longer Queued (claimed, "
            "canceled or gone) at send time; a task still Queued gets its message (at once, or "
            "after a hold: `hold_depth`)."
        ),
    )
    hold_depth: int = Field(
        100,
        ge=0,
        le=100_000,
        description=(
            "With `skip_not_queued`: while a queue's workers claim ahead (a `task-claim-next` of "
            "the queue came back full within `hold_evidence_seconds`), the wake-up of a task "
            "with at least this many Queued tasks of its queue ahead of it is held back instead "
            "of sent, and looked at again later: skipped once the task is claimed, sent once it "
            "is near the front or nobody claims ahead. Whatever its depth, a wake-up is held "
            "while its queue's workers wait on the dispatcher for its tasks (a waiting "
            "`task-claim-next`, which takes the oldest Queued task). 0: send every wake-up at once."
        ),
    )
    hold_max_seconds: float = Field(
        10.0,
        ge=1,
        le=60,
        description=(
            "A held wake-up is looked at again after twice its row's age, at least 1 s and at "
            "most this long: the longest a held wake-up waits once nobody claims ahead."
        ),
    )
    hold_evidence_seconds: float = Field(
        HOLD_EVIDENCE_SECONDS,
        gt=0,
        le=3600,
        description=(
            "How long after a queue's last full `task-claim-next` its workers count as claiming "
            "ahead, so wake-ups deep in its backlog are held (`hold_depth`)."
        ),
    )
    retry_base_seconds: float = Field(
        1.0, ge=0, description="Base of the full-jitter backoff before re-sending a failed row."
    )
    retry_max_seconds: float = Field(
        300.0, ge=0, description="Cap of the backoff before re-sending a failed row."
    )
    missing_queue_probe_base_seconds: float = Field(
        5.0,
        gt=0,
        le=3600,
        description=(
            "A task queue whose SQS queue does not exist is held (none of its wake-ups is sent) "
            "and probed with GetQueueUrl this long after the failed send, then after twice the "
            "last wait each time it is still missing (docs/operations.md)."
        ),
    )
    missing_queue_probe_max_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        description=(
            "Longest wait between two probes of a held queue: the longest its wake-ups wait "
            "once its SQS queue exists (plus `missing_queue_probe_lease_seconds` for the few "
            "met while the probe was out)."
        ),
    )
    missing_queue_probe_lease_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="A relay that takes a due probe has this long to report it before another "
        "relay may probe the same queue.",
    )

    # The relay signs the attempt tokens of Lambda attempts with the dispatcher's keys.
    attempt_token_keys: dict[str, SecretStr] | None = Field(
        None,
        validation_alias=AliasChoices("TASKPLAT_ATTEMPT_TOKEN_KEYS"),
        description='The dispatcher\'s attempt-token keys (JSON `{"<kid>": "<Ed25519 private '
        "key, PEM>\"}`): the relay signs Lambda attempts' tokens with them; unset: Lambda jobs "
        "are not invoked.",
    )
    attempt_token_active_kid: str | None = Field(
        None,
        validation_alias=AliasChoices("TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID"),
        description="Key id of `TASKPLAT_ATTEMPT_TOKEN_KEYS` that signs (the dispatcher's).",
    )
    lambda_endpoint_url: str | None = Field(
        None, description="Lambda API endpoint; unset means AWS's own endpoint for the region."
    )
    lambda_function_prefix: str = Field(
        "",
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]*$",
        description="The function a `runtime: lambda` job invokes is this prefix + its operator.",
    )
    lambda_grace_seconds: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="A Lambda attempt's first lease is its function timeout (the job's "
        "`timeout_seconds`) plus this grace.",
    )
    lambda_default_timeout_seconds: int = Field(
        900,
        ge=1,
        le=900,
        description="Function timeout assumed for a Lambda task that states none (a DAG's "
        "`runtime: lambda` job must state `timeout_seconds`).",
    )
    lambda_concurrency: int = Field(
        4, ge=1, le=32, description="Lambda invocations in flight at once (one row each)."
    )
    lambda_batch_size: int = Field(
        50, ge=1, le=1000, description="Lambda invocations performed per batch of the invoker."
    )
    lambda_invoke_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=120,
        description="Longest wait for Lambda to accept one invocation; longer counts as failed "
        "(retried with backoff; the unanswered invocation can change nothing).",
    )

    untrusted_operators: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        validation_alias=AliasChoices(
            "TASKPLAT_RELAY_UNTRUSTED_OPERATORS", "TASKPLAT_DISPATCHER_UNTRUSTED_OPERATORS"
        ),
        description="Comma-separated operators whose tasks run as untrusted until their job says "
        "`trust` itself: the same list as the dispatcher's (its variable is read too), so a "
        "Lambda invocation of such an operator carries its capability token.",
    )

    @field_validator("untrusted_operators", mode="before")
    @classmethod
    def _split_operators(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def capability_token_key_settings(self) -> TokenKeySettings | None:
        """The keys that sign untrusted Lambda attempts' capability tokens (the dispatcher's);
        None when unset: untrusted Lambda jobs are then never invoked."""
        return key_settings(
            self.capability_token_keys,
            self.capability_token_active_kid,
            what="capability token keys",
        )

    def attempt_token_key_settings(self) -> TokenKeySettings | None:
        """The keys that sign Lambda attempts' tokens (the dispatcher's); None when unset."""
        return key_settings(
            self.attempt_token_keys, self.attempt_token_active_kid, what="attempt token keys"
        )

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> RelaySettings:
        if self.retry_max_seconds < self.retry_base_seconds:
            raise ValueError("retry_max_seconds must be >= retry_base_seconds")
        if self.missing_queue_probe_max_seconds < self.missing_queue_probe_base_seconds:
            raise ValueError(
                "missing_queue_probe_max_seconds must be >= missing_queue_probe_base_seconds"
            )
        self.attempt_token_key_settings()
        self.capability_token_key_settings()
        return self

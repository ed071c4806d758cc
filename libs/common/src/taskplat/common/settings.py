"""Settings fragments shared by the services.

Invariants: settings are read once, in a service's `__main__` (or a test fixture), and passed down;
nothing reads the environment elsewhere. Values shared by several services use one unprefixed name
(`DATABASE_URL`, `SQS_ENDPOINT_URL`, `AWS_REGION`, `TASKPLAT_WORKER_TOKEN`, `TASKPLAT_LOG_*`) so one
environment serves the whole stack; a service's own settings carry its prefix
(`TASKPLAT_DISPATCHER_`).
Secrets are `SecretStr`, so they never print.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from taskplat.common.documents import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_NODES,
    PARSER_MAX_DEPTH,
    DocumentLimits,
)

LogFormat = Literal["json", "console"]


_FRAGMENT_CONFIG = SettingsConfigDict(
    extra="ignore", frozen=True, case_sensitive=False, populate_by_name=True
)


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class ServiceSettings(BaseSettings):
    """Base of every service's settings class."""

    model_config = SettingsConfigDict(
        extra="ignore", frozen=True, case_sensitive=False, populate_by_name=True
    )

    log_level: str = Field(
        "INFO", validation_alias=_alias("TASKPLAT_LOG_LEVEL"), description="Log level."
    )
    log_format: LogFormat = Field(
        "json",
        validation_alias=_alias("TASKPLAT_LOG_FORMAT"),
        description="`json` in production, `console` for people.",
    )
    thread_switch_interval_seconds: float = Field(
        0.0005,
        gt=0,
        le=1,
        validation_alias=_alias("TASKPLAT_THREAD_SWITCH_INTERVAL_SECONDS"),
        description="Longest a thread keeps the GIL while another waits (Python's own default: "
        "0.005); short, so a wake-up handed from one thread to another is not held up.",
    )


class DatabaseSettings(BaseSettings):
    """Postgres connection fragment for the dispatcher and the loops."""

    model_config = _FRAGMENT_CONFIG

    database_url: SecretStr = Field(
        SecretStr("postgresql://taskplat@127.0.0.1:5432/taskplat"),
        validation_alias=_alias("DATABASE_URL"),
        description="libpq URL of the Postgres database.",
    )
    db_pool_min_size: int = Field(
        2, ge=1, validation_alias=_alias("TASKPLAT_DB_POOL_MIN_SIZE"), description="Pool minimum."
    )
    db_pool_max_size: int = Field(
        10, ge=1, validation_alias=_alias("TASKPLAT_DB_POOL_MAX_SIZE"), description="Pool maximum."
    )
    db_connect_timeout_seconds: float = Field(
        10.0,
        gt=0,
        validation_alias=_alias("TASKPLAT_DB_CONNECT_TIMEOUT_SECONDS"),
        description="How long to wait for a pooled connection.",
    )


class MigrateSettings(BaseSettings):
    """Timeouts of `taskplat-migrate`: a migration that would queue behind a long transaction
    (blocking every query queued behind it) or run too long fails instead, and can be retried."""

    model_config = _FRAGMENT_CONFIG

    lock_timeout_seconds: float = Field(
        5.0,
        ge=0,
        validation_alias=_alias("TASKPLAT_MIGRATE_LOCK_TIMEOUT_SECONDS"),
        description="Longest wait for a table lock per statement (0: no limit).",
    )
    statement_timeout_seconds: float = Field(
        900.0,
        ge=0,
        validation_alias=_alias("TASKPLAT_MIGRATE_STATEMENT_TIMEOUT_SECONDS"),
        description="Longest run of one migration statement (0: no limit).",
    )


class SqsSettings(BaseSettings):
    """SQS fragment for the relay, the scheduler and the worker wrapper."""

    model_config = _FRAGMENT_CONFIG

    sqs_endpoint_url: str | None = Field(
        None,
        validation_alias=_alias("SQS_ENDPOINT_URL"),
        description="SQS endpoint; unset means AWS's own endpoint for the region.",
    )
    aws_region: str = Field(
        "us-east-1",
        validation_alias=_alias("AWS_REGION", "AWS_DEFAULT_REGION"),
        description="Region.",
    )
    sqs_queue_prefix: str = Field(
        "taskplat-",
        validation_alias=_alias("TASKPLAT_SQS_QUEUE_PREFIX"),
        description="SQS queue name = prefix + task queue name.",
    )
    dead_letter_queue_name: str = Field(
        "taskplat-dead-letters",
        validation_alias=_alias("TASKPLAT_DEAD_LETTER_QUEUE"),
        description="SQS queue that receives dead-letter records of Dead tasks.",
    )
    sqs_wire_client: bool = Field(
        True,
        validation_alias=_alias("TASKPLAT_SQS_WIRE_CLIENT"),
        description="Send, receive, delete and visibility calls signed by botocore and sent with "
        "urllib3, at about 60% of a boto3 call's CPU; false: every call through boto3.",
    )


class WakeupHoldSettings(BaseSettings):
    """Fragment of the services that create tasks: the dispatcher (creates, manual job runs), the
    scheduler (scheduled job runs) and the relay (runs routed from dataset events)."""

    model_config = _FRAGMENT_CONFIG

    polled_wakeup_delay_seconds: float = Field(
        1.0,
        ge=0,
        le=60,
        validation_alias=_alias(
            "TASKPLAT_POLLED_WAKEUP_DELAY_SECONDS",
            "TASKPLAT_DISPATCHER_POLLED_WAKEUP_DELAY_SECONDS",  # its name before it was shared
        ),
        description="While a queue's workers wait on a `task-claim-next`, how long a new task's "
        "SQS wake-up is held back: a waiting worker claims the task at once, and the relay sends "
        "the wake-up then only if the task is still Queued (0: never held). Applies to every new "
        "task: creates, job runs by hand, by schedule and routed from dataset events.",
    )


class WorkerTokenSettings(BaseSettings):
    """The bearer token workers present on /internal routes."""

    model_config = _FRAGMENT_CONFIG

    worker_token: SecretStr = Field(
        validation_alias=_alias("TASKPLAT_WORKER_TOKEN"),
        min_length=16,
        description="Bearer token of the internal worker API (at least 16 characters).",
    )


class DocumentLimitSettings(BaseSettings):
    """Limits of the JSON and YAML documents a service's routes accept (its own prefix)."""

    model_config = _FRAGMENT_CONFIG

    max_document_depth: int = Field(
        DEFAULT_MAX_DEPTH,
        ge=1,
        le=PARSER_MAX_DEPTH,
        description="Deepest nesting of containers a JSON or YAML request body may have, at most "
        "200; deeper is refused with 422 (docs/security.md, Document limits).",
    )
    max_document_nodes: int = Field(
        DEFAULT_MAX_NODES,
        ge=1,
        description="Most nodes (values and mapping keys) a JSON or YAML request body may have; "
        "more is refused with 422 (docs/security.md, Document limits).",
    )

    def document_limits(self) -> DocumentLimits:
        return DocumentLimits(self.max_document_depth, self.max_document_nodes)


def _json_object(value: object) -> object:
    """A JSON text given as a value (not through the environment) is parsed, like the env's."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ValueError('must be a JSON object {"<kid>": "<secret>"}') from None
    return value


class AttemptTokenSettings(BaseSettings):
    """Signing keys of attempt tokens (dispatcher). Unset: one key derived from the worker token
    (kid `worker-token`), which adds no secret beyond the one the dispatcher already holds."""

    model_config = _FRAGMENT_CONFIG

    attempt_token_keys: dict[str, SecretStr] | None = Field(
        None,
        validation_alias=_alias("TASKPLAT_ATTEMPT_TOKEN_KEYS"),
        description='JSON object `{"<kid>": "<Ed25519 private key, PEM>"}` of the keys that sign '
        "and verify attempt tokens (two during a rotation; an HS256 secret of 32+ bytes is still "
        "accepted for verification while a deployment moves off HS256); unset: an Ed25519 key "
        "derived from the worker token.",
    )
    attempt_token_active_kid: str | None = Field(
        None,
        validation_alias=_alias("TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID"),
        description="Key id of `TASKPLAT_ATTEMPT_TOKEN_KEYS` (an Ed25519 private key) that signs "
        "new attempt tokens.",
    )

    @field_validator("attempt_token_keys", mode="before")
    @classmethod
    def _json_attempt_keys(cls, value: object) -> object:
        return _json_object(value)


class CapabilityTokenSettings(BaseSettings):
    """Keys of capability tokens: the dispatcher and the relay sign (Ed25519 private keys), the
    credential broker and the query service verify (the public keys only)."""

    model_config = _FRAGMENT_CONFIG

    capability_token_keys: dict[str, SecretStr] | None = Field(
        None,
        validation_alias=_alias("TASKPLAT_CAPABILITY_TOKEN_KEYS"),
        description='JSON object `{"<kid>": "<Ed25519 key, PEM>"}`: private keys in the '
        "signers (dispatcher, relay), their public halves in the verifiers (broker, query "
        "service); two during a rotation, and an HS256 secret of 32+ bytes is still accepted for "
        "verification while a deployment moves off HS256.",
    )
    capability_token_active_kid: str | None = Field(
        None,
        validation_alias=_alias("TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID"),
        description="Key id of `TASKPLAT_CAPABILITY_TOKEN_KEYS` (an Ed25519 private key) that "
        "signs new capability tokens (signers only).",
    )

    @field_validator("capability_token_keys", mode="before")
    @classmethod
    def _json_capability_keys(cls, value: object) -> object:
        return _json_object(value)

    data_bucket: str = Field(
        "taskplat-data",
        validation_alias=_alias("TASKPLAT_DATA_BUCKET"),
        pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        description="S3 bucket of datasets (`dataset/{uuid}/version/{version}/`) and scratch "
        "space (`scratch/{task_id}/{attempt}/`).",
    )

"""Settings of the query service (env prefix `TASKPLAT_QUERY_`, plus the shared names).

Invariants: the capability-token keys (`TASKPLAT_CAPABILITY_TOKEN_KEYS`: the public halves of the
Ed25519 keys the dispatcher signs with; a private key is refused) and the read-only database URL are
required, and stay in the service's process (its sandboxes get none of its environment); the
service holds no private key, no attempt-token key, no worker token and no write right anywhere;
every limit has a production-sensible default.
"""

from __future__ import annotations

from typing import Self

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from taskplat.common.settings import CapabilityTokenSettings, ServiceSettings
from taskplat.common.telemetry import TelemetrySettings
from taskplat.common.tokens.keys import TokenKeySettings, verifier_key_settings


class QuerySettings(ServiceSettings, CapabilityTokenSettings, TelemetrySettings):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_QUERY_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in a container).")
    port: int = Field(8092, ge=1, le=65535, description="Port to listen on.")
    database_url: SecretStr = Field(
        description="libpq URL of a login user that is only a member of `taskplat_query` (it may "
        "SELECT dataset tables and nothing else); the service reads a query's pinned tables "
        "through it, never its sandboxes."
    )
    role_arn: str = Field(
        pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/\S+$",
        description="Role assumed for each query with a session policy narrowed to the token's "
        "input prefixes (read-only); its own policy: S3 reads on the data bucket.",
    )
    aws_region: str = Field(
        "us-east-1",
        validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"),
        description="Region of STS and S3.",
    )
    sts_endpoint_url: str | None = Field(
        None, description="STS endpoint; unset means AWS's regional endpoint."
    )
    s3_endpoint_url: str | None = Field(
        None, description="S3 endpoint (`http://host:port`, path style); unset means AWS's."
    )
    max_rows: int = Field(
        10_000, ge=1, le=10_000_000, description="Most rows one answer holds (`truncated`)."
    )
    max_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Most bytes of rows one answer holds (`truncated`)."
    )
    timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Longest run of one query; past it 408 (its sandbox killed).",
    )
    memory_limit: str = Field(
        "512MB", pattern=r"^[0-9]+(\.[0-9]+)?\s*[KMGT]i?B$", description="DuckDB memory per query."
    )
    workers: int = Field(
        8, ge=1, le=256, description="Queries run at once by this process (more wait their turn)."
    )
    threads: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "DuckDB threads per query. Above 1, each sandbox starts them and locks its "
            "configuration itself (a fork keeps only the forking thread): more CPU per query, "
            "for large inputs on more than one vCPU."
        ),
    )
    sandboxes: int = Field(
        4,
        ge=0,
        le=64,
        description="Sandboxes kept prepared ahead (a locked-down DuckDB in its own process, each "
        "for one query); past them a query prepares its own.",
    )
    max_input_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Most bytes (as Arrow) of one input a query may read; past it 422.",
    )
    concurrent_per_token: int = Field(
        2, ge=1, description="Queries one token may run at once (429 past it)."
    )
    rate_limit_per_token: int = Field(
        120, ge=1, description="Queries one token may start per `rate_limit_window_seconds` (429)."
    )
    rate_limit_window_seconds: float = Field(60.0, gt=0, description="Window of the rate limit.")
    max_body_bytes: int = Field(256 * 1024, ge=64, description="Request body size cap (413).")
    connect_timeout_seconds: int = Field(
        10, ge=1, le=300, description="Postgres connect timeout of the catalog and the attach."
    )

    def token_keys(self) -> TokenKeySettings:
        """The capability tokens' public keys (a private key is refused: this service verifies
        only); `TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID` is ignored."""
        return verifier_key_settings(
            self.capability_token_keys, what="TASKPLAT_CAPABILITY_TOKEN_KEYS"
        )

    @model_validator(mode="after")
    def _keys_set(self) -> Self:
        self.token_keys()
        return self

    def telemetry_settings(self) -> TelemetrySettings:
        return TelemetrySettings(
            otlp_endpoint=self.otlp_endpoint, trace_sample_ratio=self.trace_sample_ratio
        )

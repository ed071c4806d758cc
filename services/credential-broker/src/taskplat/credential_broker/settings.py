"""Settings of the credential broker (env prefix `TASKPLAT_BROKER_`, plus the shared names).

Invariants: the capability-token keys (`TASKPLAT_CAPABILITY_TOKEN_KEYS`: the public halves of the
Ed25519 keys the dispatcher signs with; a private key is refused) are required; the broker holds no
private key, no attempt-token key and no worker token, so it can mint nothing any service accepts;
every default is a production-sensible value.
"""

from __future__ import annotations

from typing import Self

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from taskplat.common.settings import (
    CapabilityTokenSettings,
    DocumentLimitSettings,
    ServiceSettings,
)
from taskplat.common.telemetry import TelemetrySettings
from taskplat.common.tokens.keys import TokenKeySettings, verifier_key_settings


class BrokerSettings(
    ServiceSettings, CapabilityTokenSettings, TelemetrySettings, DocumentLimitSettings
):
    model_config = SettingsConfigDict(
        env_prefix="TASKPLAT_BROKER_",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in a container).")
    port: int = Field(8090, ge=1, le=65535, description="Port to listen on.")
    role_arn: str = Field(
        pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/\S+$",
        description="Role the broker assumes for each request, with a session policy that "
        "narrows it to the capability's prefixes (its own policy: S3 on the data bucket).",
    )
    aws_region: str = Field(
        "us-east-1",
        validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"),
        description="Region of STS.",
    )
    sts_endpoint_url: str | None = Field(
        None, description="STS endpoint; unset means AWS's regional endpoint."
    )
    max_session_seconds: int = Field(
        3600,
        ge=900,
        le=43_200,
        description="Longest credentials handed out (also bounded by the token's life and the "
        "role's maximum session duration).",
    )
    rate_limit_per_task: int = Field(
        10, ge=1, description="Requests one task may make per `rate_limit_window_seconds` (429)."
    )
    rate_limit_window_seconds: float = Field(60.0, gt=0, description="Window of the rate limit.")
    max_body_bytes: int = Field(4096, ge=2, description="Request body size cap (413).")

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

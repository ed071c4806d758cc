"""Capability tokens: what an untrusted task may read and write (docs/contracts.md,
"Capability tokens").

Invariants:
  * Issuance is a pure function of the task's inputs and outputs, a location resolver and the
    storage layout: the same task and attempt always give the same capability.
  * Only an input entry that names a dataset version (`dataset_uuid` and `dataset_version`) grants
    a read; any other entry of `inputs` is data for the operator and grants nothing.
  * Every S3 prefix ends with `/`, so a grant on `.../version/v1/` never covers `.../version/v10/`;
    the scratch prefix is private to one `(task_id, attempt)`.
  * A token verifies only as a capability token (audience `taskplat-capability`) with a body that
    parses as `Capability`; anything else is `InvalidToken`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import Field, ValidationError

from taskplat.common.contracts.base import NO_NUL, Contract, Int64
from taskplat.common.tokens.keys import InvalidToken, KeyRing, TokenKeySettings

AUDIENCE = "taskplat-capability"
S3_SCHEME = "s3://"

Location = Annotated[str, Field(min_length=1, max_length=2048, pattern=NO_NUL)]
LocationResolver = Callable[[UUID, UUID], str]
_SLICE_FIELDS = ("cursor", "partition_key", "start", "end", "where")


class CapabilityInput(Contract):
    """A pinned input dataset version, its resolved location and the slice the task reads."""

    dataset_uuid: UUID
    dataset_version: UUID
    location: Location
    cursor: Int64 | None = None
    partition_key: Annotated[str, Field(max_length=256)] | None = None
    start: Int64 | None = None
    end: Int64 | None = None
    where: Annotated[str, Field(max_length=4096)] | None = None


class CapabilityOutput(Contract):
    output_index: Annotated[int, Field(ge=0, le=100_000)]
    dataset_uuid: UUID
    dataset_version: UUID
    prefix: Location


class Capability(Contract):
    task_id: UUID
    attempt: Annotated[int, Field(ge=1)]
    inputs: list[CapabilityInput]
    outputs: list[CapabilityOutput]
    scratch_prefix: Location

    def read_prefixes(self) -> list[str]:
        """The S3 prefixes the task may read (inputs stored elsewhere are not S3 grants)."""
        return sorted({i.location for i in self.inputs if i.location.startswith(S3_SCHEME)})

    def write_prefixes(self) -> list[str]:
        """The S3 prefixes the task may write: its outputs and its scratch prefix."""
        outputs = {o.prefix for o in self.outputs if o.prefix.startswith(S3_SCHEME)}
        return sorted(outputs | {self.scratch_prefix})


@dataclass(frozen=True)
class StorageLayout:
    """Where datasets and scratch space live in S3."""

    bucket: str

    def dataset_prefix(self, dataset_uuid: UUID, dataset_version: UUID) -> str:
        return f"s3://{self.bucket}/dataset/{dataset_uuid}/version/{dataset_version}/"

    def scratch_prefix(self, task_id: UUID, attempt: int) -> str:
        return f"s3://{self.bucket}/scratch/{task_id}/{attempt}/"


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key/prefix/` -> (`bucket`, `key/prefix/`)."""
    if not uri.startswith(S3_SCHEME):
        raise ValueError(f"not an S3 URI: {uri!r}")
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, key


def _as_prefix(location: str) -> str:
    if location.startswith(S3_SCHEME) and not location.endswith("/"):
        return location + "/"
    return location


def _dataset_ref(entry: object) -> tuple[UUID, UUID] | None:
    if not isinstance(entry, Mapping):
        return None
    try:
        return UUID(str(entry["dataset_uuid"])), UUID(str(entry["dataset_version"]))
    except (KeyError, ValueError):
        return None


def build_capability(
    task_id: UUID,
    attempt: int,
    inputs: Sequence[object],
    outputs: Sequence[Mapping[str, Any]],
    *,
    layout: StorageLayout,
    resolve: LocationResolver | None = None,
) -> Capability:
    """The capability of one attempt. `inputs`: the task's `inputs` entries; `outputs`: the claim's
    `{output_index, dataset_uuid, dataset_version, location?}`; `resolve(uuid, version)` gives a
    dataset version's storage location (default: the layout's S3 prefix)."""
    resolver = resolve or layout.dataset_prefix
    granted: list[CapabilityInput] = []
    for entry in inputs:
        ref = _dataset_ref(entry)
        if ref is None:
            continue
        assert isinstance(entry, Mapping)
        slice_ = {k: entry[k] for k in _SLICE_FIELDS if k in entry}
        try:
            granted.append(
                CapabilityInput(
                    dataset_uuid=ref[0],
                    dataset_version=ref[1],
                    location=_as_prefix(resolver(*ref)),
                    **slice_,
                )
            )
        except ValidationError:
            continue  # a malformed slice grants nothing
    written = [
        CapabilityOutput(
            output_index=output["output_index"],
            dataset_uuid=output["dataset_uuid"],
            dataset_version=output["dataset_version"],
            prefix=_as_prefix(
                resolver(UUID(str(output["dataset_uuid"])), UUID(str(output["dataset_version"])))
            ),
        )
        for output in outputs
    ]
    return Capability(
        task_id=task_id,
        attempt=attempt,
        inputs=granted,
        outputs=written,
        scratch_prefix=layout.scratch_prefix(task_id, attempt),
    )


def capability_key_ring(settings: TokenKeySettings) -> KeyRing:
    return KeyRing(settings, audience=AUDIENCE)


def issue_capability_token(
    ring: KeyRing, capability: Capability, *, now: datetime, expires_at: datetime
) -> str:
    claims = {"sub": str(capability.task_id), "cap": capability.model_dump(mode="json")}
    return ring.sign(claims, issued_at=now, expires_at=expires_at)


@dataclass(frozen=True)
class VerifiedCapability:
    capability: Capability
    expires_at: int
    kid: str


def verify_capability_token(ring: KeyRing, token: str, *, now: datetime) -> VerifiedCapability:
    """The capability a valid token states, with its expiry (epoch seconds); else `InvalidToken`."""
    claims = ring.verify(token, now=now)
    try:
        capability = Capability.model_validate(claims.get("cap"))
    except ValidationError:
        raise InvalidToken("the token is not a capability token") from None
    if str(capability.task_id) != claims.get("sub"):
        raise InvalidToken("the token is not a capability token")
    return VerifiedCapability(capability, claims["exp"], ring.kid_of(token))

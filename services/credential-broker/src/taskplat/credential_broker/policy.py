"""The session policy and duration of the credentials a capability is exchanged for.

Invariants:
  * The policy allows exactly the capability's prefixes: `s3:GetObject` under each input prefix,
    `s3:GetObject`, `s3:PutObject`, `s3:DeleteObject`, `s3:AbortMultipartUpload` and
    `s3:ListMultipartUploadParts` under each output and the scratch prefix, and `s3:ListBucket`
    on each bucket only with an `s3:prefix` condition naming those prefixes. Nothing else: a
    session policy can only narrow the role's own permissions, never widen them.
  * Every statement holds only until the token's expiry (`aws:CurrentTime` before it): STS grants
    at least 900 s, so when the token has less left the credentials outlive it on paper but are
    refused by IAM once the token has expired.
  * The document is deterministic (sorted buckets and prefixes) and packed: STS caps a session
    policy at 2048 characters; a larger one is `PolicyTooLarge`, never silently cut.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from taskplat.common.errors import ValidationFailed
from taskplat.common.tokens.capability import Capability, split_s3_uri

STS_MIN_SECONDS = 900
POLICY_MAX_CHARS = 2048
READ_ACTIONS = ["s3:GetObject"]
WRITE_ACTIONS = [
    "s3:AbortMultipartUpload",
    "s3:DeleteObject",
    "s3:GetObject",
    "s3:ListMultipartUploadParts",
    "s3:PutObject",
]


class PolicyTooLarge(ValidationFailed):
    code = "policy_too_large"


def _by_bucket(prefixes: list[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for uri in prefixes:
        bucket, key = split_s3_uri(uri)
        grouped[bucket].append(key)
    return {bucket: sorted(keys) for bucket, keys in sorted(grouped.items())}


def session_policy(capability: Capability, expires_at: int) -> dict[str, Any]:
    """The IAM session policy of `capability`, valid until `expires_at` (epoch seconds)."""
    until = datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    in_time = {"DateLessThan": {"aws:CurrentTime": until}}
    reads = _by_bucket(capability.read_prefixes())
    writes = _by_bucket(capability.write_prefixes())
    statements: list[dict[str, Any]] = []
    if reads:
        statements.append(
            {
                "Sid": "ReadInputs",
                "Effect": "Allow",
                "Action": READ_ACTIONS,
                "Resource": [f"arn:aws:s3:::{b}/{k}*" for b, keys in reads.items() for k in keys],
                "Condition": in_time,
            }
        )
    statements.append(
        {
            "Sid": "WriteOutputsAndScratch",
            "Effect": "Allow",
            "Action": WRITE_ACTIONS,
            "Resource": [f"arn:aws:s3:::{b}/{k}*" for b, keys in writes.items() for k in keys],
            "Condition": in_time,
        }
    )
    listed: dict[str, set[str]] = defaultdict(set)
    for grouped in (reads, writes):
        for bucket, keys in grouped.items():
            listed[bucket].update(keys)
    for index, (bucket, prefixes) in enumerate(sorted(listed.items())):
        statements.append(
            {
                "Sid": f"List{index}",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {
                    **in_time,
                    "StringLike": {"s3:prefix": [f"{key}*" for key in sorted(prefixes)]},
                },
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def packed(policy: dict[str, Any]) -> str:
    text = json.dumps(policy, separators=(",", ":"))
    if len(text) > POLICY_MAX_CHARS:
        raise PolicyTooLarge(
            f"the capability's session policy has {len(text)} characters, over STS's "
            f"{POLICY_MAX_CHARS}: issue capabilities with fewer prefixes"
        )
    return text


def session_seconds(expires_at: int, now: datetime, max_seconds: int) -> int:
    """How long to ask STS for: the token's remaining life, capped by `max_seconds`, and never
    below STS's minimum of 900 s (the policy's time condition ends the rest)."""
    remaining = int(expires_at - now.timestamp())
    return max(STS_MIN_SECONDS, min(remaining, max_seconds))

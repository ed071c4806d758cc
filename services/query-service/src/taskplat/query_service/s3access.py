"""S3 credentials of one capability: read-only, limited to its input prefixes.

Invariants:
  * The session policy allows `s3:GetObject` under each S3 input prefix of the token and
    `s3:ListBucket` on each bucket only for those prefixes (DuckDB lists a prefix to glob it);
    nothing is writable. Every statement holds only until the token's expiry.
  * Credentials are cached per (task, attempt, expiry) and reused until one minute before STS
    expires them; a capability with no S3 input gets none (no AssumeRole call).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from taskplat.common.tokens.capability import Capability, split_s3_uri

STS_MIN_SECONDS = 900
REUSE_MARGIN = timedelta(seconds=60)


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: datetime


def read_policy(prefixes: list[str], expires_at: int) -> dict[str, Any]:
    """The session policy of reading exactly `prefixes` until `expires_at` (epoch seconds)."""
    until = datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    in_time = {"DateLessThan": {"aws:CurrentTime": until}}
    by_bucket: dict[str, list[str]] = defaultdict(list)
    for uri in prefixes:
        bucket, key = split_s3_uri(uri)
        by_bucket[bucket].append(key)
    statements: list[dict[str, Any]] = [
        {
            "Sid": "ReadInputs",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": [
                f"arn:aws:s3:::{bucket}/{key}*"
                for bucket, keys in sorted(by_bucket.items())
                for key in sorted(keys)
            ],
            "Condition": in_time,
        }
    ]
    for index, (bucket, keys) in enumerate(sorted(by_bucket.items())):
        statements.append(
            {
                "Sid": f"List{index}",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {
                    **in_time,
                    "StringLike": {"s3:prefix": [f"{k}*" for k in sorted(keys)]},
                },
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


class CredentialSource:
    def __init__(self, sts: Any, role_arn: str, max_entries: int = 10_000) -> None:
        self._sts = sts
        self._role_arn = role_arn
        self._max_entries = max_entries
        self._cache: dict[tuple[str, int, int], S3Credentials] = {}
        self._lock = threading.Lock()

    def for_capability(
        self, capability: Capability, prefixes: list[str], expires_at: int, now: datetime
    ) -> S3Credentials:
        key = (str(capability.task_id), capability.attempt, expires_at)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and cached.expiration - REUSE_MARGIN > now:
            return cached
        policy = json.dumps(read_policy(prefixes, expires_at), separators=(",", ":"))
        answer = self._sts.assume_role(
            RoleArn=self._role_arn,
            RoleSessionName=f"q-{capability.task_id.hex}-{capability.attempt}"[:64],
            Policy=policy,
            DurationSeconds=STS_MIN_SECONDS,
        )
        raw = answer["Credentials"]
        expiration = raw["Expiration"]
        if isinstance(expiration, str):
            expiration = datetime.fromisoformat(expiration)
        credentials = S3Credentials(
            raw["AccessKeyId"], raw["SecretAccessKey"], raw["SessionToken"], expiration
        )
        with self._lock:
            if len(self._cache) >= self._max_entries:
                self._cache.clear()
            self._cache[key] = credentials
        return credentials

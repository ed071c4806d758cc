"""The session policy, duration and rate limit of the broker, as pure functions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from taskplat.common.tokens.capability import StorageLayout, build_capability
from taskplat.credential_broker.policy import (
    PolicyTooLarge,
    packed,
    session_policy,
    session_seconds,
)
from taskplat.credential_broker.ratelimit import RateLimiter

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
TASK = uuid.UUID("11111111-1111-4111-8111-111111111111")
D1, V1 = uuid.UUID(int=1), uuid.UUID(int=2)
D2, V2 = uuid.UUID(int=3), uuid.UUID(int=4)


def test_the_policy_allows_exactly_the_capabilitys_prefixes() -> None:
    capability = build_capability(
        TASK,
        2,
        [{"dataset_uuid": str(D1), "dataset_version": str(V1), "cursor": 5}],
        [{"output_index": 0, "dataset_uuid": str(D2), "dataset_version": str(V2)}],
        layout=StorageLayout("lake"),
    )
    expires = int(NOW.timestamp()) + 600
    until = {"DateLessThan": {"aws:CurrentTime": "2030-01-01T12:10:00Z"}}
    assert session_policy(capability, expires) == {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadInputs",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::lake/dataset/{D1}/version/{V1}/*"],
                "Condition": until,
            },
            {
                "Sid": "WriteOutputsAndScratch",
                "Effect": "Allow",
                "Action": [
                    "s3:AbortMultipartUpload",
                    "s3:DeleteObject",
                    "s3:GetObject",
                    "s3:ListMultipartUploadParts",
                    "s3:PutObject",
                ],
                "Resource": [
                    f"arn:aws:s3:::lake/dataset/{D2}/version/{V2}/*",
                    f"arn:aws:s3:::lake/scratch/{TASK}/2/*",
                ],
                "Condition": until,
            },
            {
                "Sid": "List0",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": ["arn:aws:s3:::lake"],
                "Condition": {
                    **until,
                    "StringLike": {
                        "s3:prefix": [
                            f"dataset/{D1}/version/{V1}/*",
                            f"dataset/{D2}/version/{V2}/*",
                            f"scratch/{TASK}/2/*",
                        ]
                    },
                },
            },
        ],
    }


def test_a_capability_without_inputs_gets_only_its_scratch_prefix() -> None:
    capability = build_capability(TASK, 1, [], [], layout=StorageLayout("lake"))
    policy = session_policy(capability, int(NOW.timestamp()) + 60)
    assert [s["Sid"] for s in policy["Statement"]] == ["WriteOutputsAndScratch", "List0"]
    assert policy["Statement"][0]["Resource"] == [f"arn:aws:s3:::lake/scratch/{TASK}/1/*"]


def test_a_policy_over_stss_size_cap_is_refused() -> None:
    inputs = [
        {"dataset_uuid": str(uuid.uuid4()), "dataset_version": str(uuid.uuid4()), "cursor": 1}
        for _ in range(30)
    ]
    capability = build_capability(TASK, 1, inputs, [], layout=StorageLayout("lake"))
    with pytest.raises(PolicyTooLarge):
        packed(session_policy(capability, int(NOW.timestamp()) + 600))


def test_duration_is_the_tokens_remaining_life_within_stss_bounds() -> None:
    now = NOW.timestamp()
    assert session_seconds(int(now) + 1800, NOW, 3600) == 1800
    assert session_seconds(int(now) + 7200, NOW, 3600) == 3600
    # Less than STS's minimum left: 900 s, and the policy's time condition ends it earlier.
    assert session_seconds(int(now) + 120, NOW, 3600) == 900


def test_rate_limit_per_task_with_a_sliding_window() -> None:
    limiter = RateLimiter(2, 10.0)
    a, b = uuid.uuid4(), uuid.uuid4()
    assert limiter.allow(a, 0.0) is None and limiter.allow(a, 1.0) is None
    assert limiter.allow(a, 2.0) == pytest.approx(8.0)
    assert limiter.allow(b, 2.0) is None  # per task
    assert limiter.allow(a, 10.5) is None  # the first one left the window
    small = RateLimiter(1, 10.0, max_tasks=1)
    assert small.allow(a, 0.0) is None and small.allow(b, 0.0) is None
    assert small.allow(a, 1.0) is None  # forgotten beyond max_tasks

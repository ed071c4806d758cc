"""The session policy of the query service's S3 credentials: read-only, exactly the token's input
prefixes, until the token's expiry (LocalStack does not enforce IAM, so the document is what is
asserted)."""

from __future__ import annotations

from taskplat.query_service.s3access import read_policy


def test_the_policy_reads_exactly_the_input_prefixes_until_the_tokens_expiry() -> None:
    prefixes = [
        "s3://lake/dataset/b/version/2/",
        "s3://lake/dataset/a/version/1/",
        "s3://other/dataset/c/version/3/",
    ]
    until = {"DateLessThan": {"aws:CurrentTime": "2026-01-01T00:00:00Z"}}
    assert read_policy(prefixes, 1767225600) == {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadInputs",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [
                    "arn:aws:s3:::lake/dataset/a/version/1/*",
                    "arn:aws:s3:::lake/dataset/b/version/2/*",
                    "arn:aws:s3:::other/dataset/c/version/3/*",
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
                    "StringLike": {"s3:prefix": ["dataset/a/version/1/*", "dataset/b/version/2/*"]},
                },
            },
            {
                "Sid": "List1",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": ["arn:aws:s3:::other"],
                "Condition": {**until, "StringLike": {"s3:prefix": ["dataset/c/version/3/*"]}},
            },
        ],
    }

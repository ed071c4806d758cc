"""Fixtures of the query service's tests: the bucket, a `taskplat_query` login user, two inputs (a
buffered Postgres dataset and an S3 Parquet dataset) and the served app."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from query_harness import (
    BUCKET,
    Dataset,
    aws,
    buffered_dataset,
    query_user,
    s3_dataset,
    served,
    settings,
)


@pytest.fixture(scope="module")
def bucket(sqs_endpoint_url: str) -> str:
    s3 = aws("s3", sqs_endpoint_url)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture
def reader_url(db_url: str) -> Iterator[str]:
    with query_user(db_url) as url:
        yield url


@pytest.fixture
def inputs(db_url: str, sqs_endpoint_url: str, bucket: str) -> tuple[Dataset, Dataset]:
    alerts = buffered_dataset(
        db_url,
        "alerts",
        [{"name": "block", "type": "bigint"}, {"name": "severity", "type": "text"}],
        [{"block": b, "severity": s} for b, s in ((1, "low"), (2, "critical"), (4, "high"))],
    )
    prices = s3_dataset(
        db_url,
        sqs_endpoint_url,
        "prices",
        "SELECT b::BIGINT AS block, (b * 1.5)::DOUBLE AS price FROM range(1, 4) t(b)",
    )
    return alerts, prices


@pytest.fixture
def service(reader_url: str, sqs_endpoint_url: str) -> Iterator[httpx.Client]:
    with served(settings(reader_url, sqs_endpoint_url)) as client:
        yield client

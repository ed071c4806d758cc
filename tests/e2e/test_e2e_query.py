"""End to end: the untrusted join of `make demo` on a stack that runs the credential broker and
the query service. Every service is a real process: an untrusted operator writes an S3 Parquet
dataset with broker credentials, another job publishes a buffered Postgres dataset, and an
untrusted run pinned to both reads them through `query()` (it has no database URL and no AWS
credentials) and publishes the joined rows, which the sink writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_stack import e2e_stack

from taskplat.devstack.demo.query import operators_file, run_query_demo

pytestmark = pytest.mark.e2e


def test_an_untrusted_job_joins_its_two_inputs_through_the_query_service(
    database_url: str, sqs_endpoint_url: str, tmp_path: Path
) -> None:
    operators = operators_file(tmp_path)
    with e2e_stack(
        "query",
        tmp_path / "stack",
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=1,
        env={"TASKPLAT_WORKER_OPERATORS_FILE": str(operators)},
        data_services=True,
    ) as stack:
        ok, report = run_query_demo(stack.api, timeout=180)
        assert ok, f"{report}\n{stack.log_tails()}"

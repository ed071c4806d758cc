"""Schemathesis against the live query service's own `/openapi.json`: `POST /query`.

Invariants checked: the document is valid OpenAPI 3.1; for every generated request (valid and
invalid bodies: schemathesis's positive and negative modes, sent with a valid capability token
pinning a real buffered dataset) the service answers no 5xx and every answer conforms to the
document (documented status code, content type, body schema). A body the schema allows may still
be refused (400 unparseable SQL, 403 a refused statement, 422 a failing query): JSON Schema cannot
state "SQL DuckDB parses and the guard allows", so `positive_data_acceptance` is excluded; and a
body over the size cap answers the documented 413 whatever it holds.

Bounded and deterministic: `max_examples`, hypothesis `derandomize=True`, no example database.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from query_harness import ask, buffered_dataset, mint, query_user, served
from query_harness import settings as query_settings
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

MAX_EXAMPLES = 25


@pytest.fixture
def live(db_url: str, sqs_endpoint_url: str) -> Iterator[tuple[httpx.Client, str]]:
    alerts = buffered_dataset(
        db_url, "alerts", [{"name": "block", "type": "bigint"}], [{"block": 1}, {"block": 2}]
    )
    token = mint([alerts])
    with query_user(db_url) as reader:
        config = query_settings(reader, sqs_endpoint_url, rate_limit_per_token=10_000)
        with served(config) as client:
            assert ask(client, token, "SELECT sum(block) FROM alerts").json()["rows"] == [[3]]
            yield client, token


def test_post_query_answers_within_its_document(live: tuple[httpx.Client, str]) -> None:
    client, token = live
    api_schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    operation = api_schema["/query"]["POST"]
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Case) -> None:
        response = case.call(
            base_url=str(client.base_url), headers={"Authorization": f"Bearer {token}"}
        )
        if response.status_code == 413:
            # A body over the size cap is refused whatever it holds (negative or not): that is
            # not the schema's rejection, but it must still be the documented error.
            assert response.json()["error"] == "payload_too_large"
            return
        case.validate_response(response, excluded_checks=[positive_data_acceptance])

    fuzz()

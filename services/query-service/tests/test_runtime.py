"""`taskplat.lambda_runtime.query` against the real query service: the token and URL come from the
environment the wrapper gives an untrusted operator (or from a Lambda invocation's event), the
join answers as records, a refusal raises `QueryError` naming it, and no token is a clear error."""

from __future__ import annotations

import httpx
import pytest
from query_harness import Dataset, mint

from taskplat.lambda_runtime import QueryError, query, query_bytes
from taskplat.lambda_runtime.query_client import invocation_token

JOIN = "SELECT a.block, p.price FROM alerts a JOIN prices p USING (block) ORDER BY 1"


def test_query_reads_the_token_and_url_from_the_operator_environment(
    service: httpx.Client, inputs: tuple[Dataset, Dataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKPLAT_QUERY_URL", str(service.base_url))
    monkeypatch.setenv("TASKPLAT_CAPABILITY_TOKEN", mint(inputs))
    result = query(JOIN)
    assert result.records() == [{"block": 1, "price": 1.5}, {"block": 2, "price": 3.0}]
    assert query("SELECT count(*) FROM alerts WHERE severity = ?", ["low"]).rows == [[1]]
    assert query_bytes(JOIN, format="csv").decode().splitlines()[1] == "1,1.5"
    with pytest.raises(QueryError) as refused:
        query("SELECT * FROM read_csv('/etc/passwd')")
    assert refused.value.status == 403 and "read_csv" in refused.value.message


def test_a_lambda_invocations_token_wins_over_the_environment(
    service: httpx.Client, inputs: tuple[Dataset, Dataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKPLAT_QUERY_URL", str(service.base_url))
    monkeypatch.setenv("TASKPLAT_CAPABILITY_TOKEN", mint([inputs[1]]))  # prices only
    reset = invocation_token.set(mint(inputs))
    try:
        assert query("SELECT count(*) FROM alerts").rows == [[3]]
    finally:
        invocation_token.reset(reset)
    with pytest.raises(QueryError) as refused:
        query("SELECT count(*) FROM alerts")
    assert refused.value.status == 403


def test_no_token_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKPLAT_CAPABILITY_TOKEN", raising=False)
    monkeypatch.setenv("TASKPLAT_QUERY_URL", "http://127.0.0.1:9")
    with pytest.raises(QueryError, match="TASKPLAT_CAPABILITY_TOKEN is not set"):
        query("SELECT 1")

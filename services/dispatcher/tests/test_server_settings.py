"""The performance settings of the dispatcher process: uvicorn's event loop and HTTP parser
(fast ones when installed, a logged fallback otherwise, an error when asked for one missing) and
psycopg's prepared statements on the app's own pool."""

from __future__ import annotations

import pytest

from taskplat.common.errors import ConfigurationError
from taskplat.dispatcher import server_impl
from taskplat.dispatcher.app import create_app
from taskplat.dispatcher.server_impl import choose_server_impl
from taskplat.testkit.dispatcher_harness import make_settings

URL = "postgresql://nobody@127.0.0.1:1/none"


def test_auto_takes_the_fast_implementations_when_they_are_installed() -> None:
    impl = choose_server_impl(make_settings(URL))
    expected_loop = "uvloop" if server_impl._installed("uvloop") else "asyncio"
    expected_http = "httptools" if server_impl._installed("httptools") else "h11"
    assert (impl.loop, impl.http) == (expected_loop, expected_http)


def test_explicit_choices_are_honoured() -> None:
    impl = choose_server_impl(make_settings(URL, event_loop="asyncio", http_parser="h11"))
    assert (impl.loop, impl.http, impl.missing) == ("asyncio", "h11", ())


def test_a_missing_fast_implementation_falls_back_under_auto_and_fails_when_asked_for() -> None:
    missing: list[str] = []
    module = "taskplat_no_such_module"
    assert server_impl._choose("auto", module, "fallback", missing) == "fallback"
    assert missing == [module]
    with pytest.raises(ConfigurationError, match="not installed"):
        server_impl._choose(module, module, "fallback", [])


@pytest.mark.parametrize(("threshold", "expected"), [(-1, None), (0, 0), (2, 2)])
def test_the_apps_own_pool_prepares_statements_as_set(threshold: int, expected: int | None) -> None:
    app = create_app(make_settings(URL, db_prepare_threshold=threshold))
    assert app.state.pool.kwargs["prepare_threshold"] == expected

"""Fixtures shared by the end-to-end tests: when a test fails, the tails of the service logs of
every stack running at that moment are attached to its report.

Invariant: this file only reports; the stacks themselves are module fixtures built with
`e2e_stack.e2e_stack`, one per test module, so tests that can share a stack do.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from e2e_stack import ACTIVE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed:
        for running in ACTIVE:
            for name, tail in running.log_tails().items():
                report.sections.append((f"stack {running.name}: {name}.log (last lines)", tail))

"""Fixtures of the worker wrapper's tests (the harness lives in `wrapper_harness`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from wrapper_harness import Dispatcher, Queue, make_queue, run_dispatcher, write_operators_file


@pytest.fixture
def dispatcher(db_url: str, tmp_path: Path) -> Iterator[Dispatcher]:
    with run_dispatcher(db_url, tmp_path) as served:
        yield served


@pytest.fixture
def queue(sqs_endpoint_url: str) -> Iterator[Queue]:
    created = make_queue(sqs_endpoint_url)
    yield created
    created.client.delete_queue(QueueUrl=created.url)


@pytest.fixture
def operators_file(tmp_path: Path) -> Path:
    return write_operators_file(tmp_path)

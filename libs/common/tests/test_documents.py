"""The document limits (`taskplat.common.documents`): depth and nodes counted the same whether a
body is cleared from its bytes alone or parsed and walked; malformed JSON is left to the caller."""

from __future__ import annotations

import json

import pytest

from taskplat.common.documents import DocumentLimits, DocumentRefused, check_json, fits_trivially


def _kind(body: bytes, limits: DocumentLimits) -> str | None:
    try:
        check_json(body, limits)
    except DocumentRefused as refused:
        return refused.kind
    return None


def test_depth_counts_containers() -> None:
    limits = DocumentLimits(max_depth=3, max_nodes=1000)
    assert _kind(b'{"a": [{"b": 1}]}', limits) is None  # 3 deep
    assert _kind(b'{"a": [{"b": [1]}]}', limits) == "max_depth"
    assert _kind(b"7", limits) is None  # a scalar alone is depth 0
    # Brackets inside strings are not containers: the walk, not the byte count, decides.
    assert not fits_trivially(b'{"a": "[[[[[["}', limits)
    assert _kind(b'{"a": "[[[[[["}', limits) is None


def test_nodes_count_values_and_keys() -> None:
    limits = DocumentLimits(max_depth=64, max_nodes=5)
    assert _kind(b'{"a": 1, "b": 2}', limits) is None  # object, 2 keys, 2 values
    assert _kind(b'{"a": 1, "b": [2]}', limits) == "max_nodes"
    many = json.dumps([0] * 200).encode()
    assert _kind(many, DocumentLimits(max_nodes=201)) is None
    assert _kind(many, DocumentLimits(max_nodes=200)) == "max_nodes"


def test_a_small_shallow_body_is_cleared_from_its_bytes() -> None:
    limits = DocumentLimits()
    heartbeat = b'{"task_id": "6f1c1b8e-4a57-4b8e-9d1c-1f0b9c2f1a01", "attempt": 1}'
    assert fits_trivially(heartbeat, limits)
    assert not fits_trivially(b"[" * 65 + b"]" * 65, limits)


@pytest.mark.parametrize("levels", [65, 201, 5000])
def test_deep_json_is_refused_past_the_parsers_own_limit_too(levels: int) -> None:
    assert _kind(b"[" * levels + b"]" * levels, DocumentLimits()) == "max_depth"


def test_malformed_json_is_left_to_the_callers_parser() -> None:
    assert _kind(b"{" * 100, DocumentLimits()) is None
    assert _kind(b"not json" * 20_000, DocumentLimits()) is None

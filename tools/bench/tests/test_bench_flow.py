"""W7's arithmetic (taskplat.bench.flow): the most attempts Running at once from their own start
and end times, each key's share of the starts while every key had work, and the token bucket's
bound `burst + per_second x t` over every window."""

from __future__ import annotations

import pytest

from taskplat.bench.config import QUICK_SIZES
from taskplat.bench.flow import skewed_bodies
from taskplat.devstack.flow_checks import max_running, rate_excess, shares_while_all_busy


def test_max_running_counts_overlaps_and_an_end_frees_a_slot_before_a_start() -> None:
    assert max_running([]) == 0
    assert max_running([(0, 1), (1, 2), (2, 3)]) == 1  # back to back: never two at once
    assert max_running([(0, 2), (1, 3), (1.5, 1.6)]) == 3
    assert max_running([(0, None), (5, 6)]) == 2  # still Running counts


def test_shares_are_counted_until_the_first_key_runs_out_of_work() -> None:
    starts = [("a", 0.0), ("a", 0.1), ("b", 0.2), ("a", 0.3), ("b", 0.4), ("a", 0.5), ("a", 0.6)]
    # b's last start is 0.4: up to then a started 3, b 2.
    assert shares_while_all_busy(starts) == {"a": 0.6, "b": 0.4}
    assert shares_while_all_busy([]) == {}


def test_rate_excess_is_the_worst_window_beyond_the_bucket() -> None:
    # 10 a second, burst 2: two at once, then one every 0.1 s, holds exactly.
    held = [0.0, 0.0, 0.1, 0.2, 0.3, 0.4]
    assert rate_excess(held, 10.0, 2) <= 1e-9
    assert rate_excess([*held, 0.4], 10.0, 2) == pytest.approx(1)  # a third at 0.4: one over
    assert rate_excess([0.0] * 5, 10.0, 2) == 3
    assert rate_excess([], 10.0, 2) == 0


def test_the_skewed_load_queues_the_hot_key_first_then_the_others_in_turn() -> None:
    bodies = skewed_bodies(QUICK_SIZES)
    keys = [body["concurrency_key"] for body in bodies]
    hot = int(QUICK_SIZES.w7_key_tasks * QUICK_SIZES.w7_hot_share)
    assert len(bodies) == QUICK_SIZES.w7_key_tasks
    assert set(keys[:hot]) == {"key-0"} and "key-0" not in keys[hot:]
    assert keys[hot : hot + 3] == ["key-1", "key-2", "key-3"]
    assert all(body["operator"] == "hold" for body in bodies)

"""Exponential backoff with full jitter, capped: the Python helpers and the SQL function
`taskplat_retry_delay` agree on the ceiling, and jitter spans [0, ceiling)."""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest

from taskplat.common.backoff import backoff_ceiling, full_jitter_delay


class FixedDraw(random.Random):
    """A random source whose `random()` always returns `value`."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_ceiling_uses_the_base_for_attempt_one_then_doubles_until_the_cap() -> None:
    assert backoff_ceiling(2.0, 100.0, 1) == 2.0
    assert [backoff_ceiling(2.0, 100.0, n) for n in range(1, 9)] == [
        2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0, 100.0,
    ]  # fmt: skip
    assert backoff_ceiling(0.5, 300.0, 3) == 2.0
    # Attempts below 1 count as the first; huge attempts neither overflow nor pass the cap.
    assert backoff_ceiling(3.0, 50.0, 0) == 3.0
    assert backoff_ceiling(3.0, 50.0, -5) == 3.0
    assert backoff_ceiling(3.0, 50.0, 10_000) == 50.0
    assert backoff_ceiling(1e-9, 1e300, 10_000) == pytest.approx(1e-9 * 2.0**60)
    # A cap below the base wins; a zero base never waits.
    assert backoff_ceiling(10.0, 4.0, 1) == 4.0
    assert backoff_ceiling(0.0, 100.0, 7) == 0.0


def test_full_jitter_is_uniform_over_zero_to_the_ceiling() -> None:
    rand = random.Random(1234)
    for attempt in (1, 2, 5, 12):
        ceiling = backoff_ceiling(1.5, 60.0, attempt)
        draws = [full_jitter_delay(1.5, 60.0, attempt, rand) for _ in range(2000)]
        assert all(0.0 <= draw < ceiling for draw in draws)
        # Full jitter: the draws cover the whole range, not a band near the ceiling.
        assert min(draws) < 0.05 * ceiling
        assert max(draws) > 0.95 * ceiling
        assert 0.4 * ceiling < sum(draws) / len(draws) < 0.6 * ceiling


def test_full_jitter_bounds_and_default_random_source() -> None:
    assert full_jitter_delay(4.0, 100.0, 3, FixedDraw(0.0)) == 0.0
    assert full_jitter_delay(4.0, 100.0, 3, FixedDraw(0.5)) == 8.0
    assert full_jitter_delay(4.0, 100.0, 3, FixedDraw(0.999)) == pytest.approx(15.984)
    for _ in range(200):
        assert 0.0 <= full_jitter_delay(4.0, 100.0, 3) < 16.0


def _sql_delay(conn: psycopg.Connection[tuple[object, ...]], *args: float) -> float:
    row = conn.execute(
        "SELECT taskplat_retry_delay(%s::float8, %s::float8, %s::int, %s::float8)", args
    ).fetchone()
    assert row is not None and isinstance(row[0], timedelta)
    return row[0].total_seconds()


def test_sql_retry_delay_matches_the_python_ceiling(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        for base, cap in ((1.0, 300.0), (2.5, 40.0), (0.0, 10.0), (10.0, 4.0)):
            for attempt in (1, 2, 3, 6, 9, 64, 10_000):
                ceiling = backoff_ceiling(base, cap, attempt)
                # jitter 1 gives the ceiling, 0 gives zero, anything between scales it.
                assert _sql_delay(conn, base, cap, attempt, 1.0) == pytest.approx(ceiling)
                assert _sql_delay(conn, base, cap, attempt, 0.0) == 0.0
                assert _sql_delay(conn, base, cap, attempt, 0.25) == pytest.approx(ceiling / 4)
                assert _sql_delay(conn, base, cap, attempt, 1.0) <= cap
        # Attempt 1 waits at most the base; attempt 0 (none in budget yet) counts as the first.
        assert _sql_delay(conn, 7.0, 100.0, 1, 1.0) == 7.0
        assert _sql_delay(conn, 7.0, 100.0, 0, 1.0) == 7.0

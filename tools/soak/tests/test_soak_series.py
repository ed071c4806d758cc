"""The soak's slope test (`taskplat.soak.series.judge`): a series that keeps growing over
the second half fails, a flat, noisy or sawtooth one passes, the first half (warm-up) is ignored,
a too-short series is not judged, and a data series is reported but never fails."""

from __future__ import annotations

import math

from taskplat.soak.series import (
    MIN_SAMPLES,
    Series,
    Tolerance,
    fit_slope,
    judge,
)

TOLERANCE = Tolerance(relative=0.10, floor=5)


def _series(values: list[float], *, judged: bool = True, step: float = 10.0) -> Series:
    series = Series("fds dispatcher", "fds", judged)
    for n, value in enumerate(values):
        series.add(n * step, value)
    return series


def test_the_least_squares_slope_of_a_line_is_its_slope() -> None:
    assert fit_slope([(0, 1), (1, 3), (2, 5)]) == 2
    assert fit_slope([(0, 7)]) == 0


def test_a_leak_over_the_second_half_fails() -> None:
    # 100 fds, then one more every sample: +20 over the second half's 200 s, allowance 12.
    values = [100.0 + n for n in range(40)]
    judgement = judge(_series(values), half=200.0, tolerance=TOLERANCE)
    assert not judgement.ok
    assert judgement.projected_growth is not None and judgement.projected_growth > 12
    assert "without bound" in judgement.reason


def test_growth_in_the_warm_up_then_a_plateau_passes() -> None:
    values = [10.0 * n for n in range(20)] + [200.0] * 20
    judgement = judge(_series(values), half=200.0, tolerance=TOLERANCE)
    assert judgement.ok, judgement
    assert judgement.projected_growth == 0


def test_a_sawtooth_and_noise_stay_within_the_allowance() -> None:
    values = [100.0 + (n % 5) * 3 + math.sin(n) for n in range(60)]
    judgement = judge(_series(values), half=300.0, tolerance=TOLERANCE)
    assert judgement.ok, judgement


def test_a_short_series_is_not_judged() -> None:
    values = [float(n) for n in range(2 * MIN_SAMPLES - 2)]
    judgement = judge(_series(values), half=(MIN_SAMPLES - 1) * 10.0, tolerance=TOLERANCE)
    assert judgement.ok and judgement.level is None
    assert "not judged" in judgement.reason


def test_a_data_series_grows_without_failing() -> None:
    values = [1000.0 * n for n in range(40)]
    judgement = judge(_series(values, judged=False), half=200.0, tolerance=TOLERANCE)
    assert judgement.ok
    assert "by design" in judgement.reason

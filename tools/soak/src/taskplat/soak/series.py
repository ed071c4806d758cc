"""The sampled series of a soak and the test that says whether one grows without bound.

The rule (docs/operations.md, "Soak"): over the second half of the run (samples taken at or
after half the load's duration; the first half is warm-up: pools fill, caches warm, tables reach
their retention), fit a least-squares line `value = a + slope * t`. Its projected growth over that
half is `slope * (t_last - t_first)`. The series fails when that growth exceeds its allowance,
`max(relative * level, floor)`, where `level` is the mean of the second half's values and
`relative` and `floor` come from the series' kind (`TOLERANCES`). A series with fewer than
`MIN_SAMPLES` samples in the second half is not judged (the run is too short to tell).

Invariants:
- A series' samples are (seconds since the load started, value), in time order.
- `judged=False` series (data that grows by design, such as a dataset's table) are sampled, drawn
  and reported, never failed.
- Which series are judged over which samples, and what a failure means (a lagging stack or a
  leak), is `verdict.decide`'s: tables' sizes and dead tuples follow the Queued backlog.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean

MIN_SAMPLES = 5


@dataclass(frozen=True)
class Tolerance:
    relative: float  # share of the second half's mean level
    floor: float  # absolute allowance, in the series' unit


# Per kind: how much a bounded series may still appear to grow over the second half (noise,
# a pool filling up, a sawtooth of autovacuum).
TOLERANCES: dict[str, Tolerance] = {
    "rss": Tolerance(0.10, 8 * 1024 * 1024),
    "fds": Tolerance(0.10, 5),
    "threads": Tolerance(0.10, 2),
    "connections": Tolerance(0.10, 2),
    "dead_tuples": Tolerance(1.00, 20_000),
    "relation_bytes": Tolerance(0.20, 8 * 1024 * 1024),
    "backlog": Tolerance(0.50, 0),  # floor set per run: the load's rate times 10 s
}
UNITS = {
    "rss": "bytes",
    "fds": "fds",
    "threads": "threads",
    "connections": "connections",
    "dead_tuples": "tuples",
    "relation_bytes": "bytes",
    "backlog": "tasks",
}


@dataclass
class Series:
    name: str  # e.g. "rss dispatcher", "dead tuples tasks"
    kind: str  # a key of TOLERANCES
    judged: bool = True
    points: list[tuple[float, float]] = field(default_factory=list)

    def add(self, t: float, value: float) -> None:
        self.points.append((t, value))


@dataclass(frozen=True)
class Judgement:
    name: str
    kind: str
    judged: bool
    samples: int
    level: float | None  # mean of the second half
    slope_per_minute: float | None
    projected_growth: float | None  # slope * the second half's span
    allowance: float | None
    ok: bool
    reason: str


def fit_slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of value over time (0 for fewer than two distinct times)."""
    if len(points) < 2:
        return 0.0
    mean_t = fmean(t for t, _ in points)
    mean_v = fmean(v for _, v in points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def judge(series: Series, half: float, tolerance: Tolerance) -> Judgement:
    """Apply the rule of the module doc to the samples taken at or after `half` seconds."""
    second = [(t, v) for t, v in series.points if t >= half]
    if len(second) < MIN_SAMPLES:
        return Judgement(
            series.name, series.kind, series.judged, len(second), None, None, None, None, True,
            f"not judged: {len(second)} samples in the second half (< {MIN_SAMPLES})",
        )  # fmt: skip
    level = fmean(v for _, v in second)
    slope = fit_slope(second)
    growth = slope * (second[-1][0] - second[0][0])
    allowance = max(tolerance.relative * abs(level), tolerance.floor)
    bounded = growth <= allowance
    if not series.judged:
        reason = "not judged: grows with the data by design"
    elif bounded:
        reason = "bounded"
    else:
        reason = "grows without bound: projected growth over the second half exceeds allowance"
    return Judgement(
        name=series.name,
        kind=series.kind,
        judged=series.judged,
        samples=len(second),
        level=level,
        slope_per_minute=slope * 60,
        projected_growth=growth,
        allowance=allowance,
        ok=bounded or not series.judged,
        reason=reason,
    )


# Series that follow the backlog of Queued tasks: the tables grow while it does (`verdict`).
FOLLOW_THE_BACKLOG = ("relation_bytes", "dead_tuples")

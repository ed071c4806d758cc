"""The soak's verdict on its series: a lagging stack or a leak (docs/operations.md, "Soak").

A pure function of the samples, so it is tested on synthetic series (tests/test_soak_verdict.py).

The rule:
- The Queued backlog is judged first (`series.judge`, allowance `max(50% of its level, the
  rate x 10 s)`). A backlog that grows over the second half means the stack is **lagging**: it
  completes fewer tasks per second than are offered (both rates are reported).
- Process series (RSS, fds, threads, connections) are judged over the whole second half whatever
  the backlog does: a process that grows is a **leak**.
- Table series (sizes, dead tuples) follow the backlog: they are judged only while the backlog
  is flat. With a flat backlog, that is the whole second half. With a growing one, it is the
  longest run of consecutive second-half samples over which the backlog stays within a band of
  the backlog floor (the rate x 10 s); a run shorter than `MIN_SAMPLES` samples leaves the tables
  unjudged (reported, with the reason). A table that grows while the backlog is flat is a leak.
- The verdict names which it was: `pass`, `lagging` (the backlog grew, nothing grew while it was
  flat: not a leak), `leak` (a series grew with the backlog flat), or `lagging and leak`; each
  problem line says so in its first words.

Invariants: every series gets exactly one judgement, in the order given; a series not judged by
design (`judged=False`) never fails; nothing here reads a clock, a file or the network.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from taskplat.soak.series import (
    FOLLOW_THE_BACKLOG,
    MIN_SAMPLES,
    TOLERANCES,
    Judgement,
    Series,
    Tolerance,
    judge,
)

BACKLOG_FLOOR_SECONDS = 10.0  # the backlog's floor: this many seconds of the offered rate


@dataclass(frozen=True)
class Rates:
    offered: float  # tasks sent per second over the load
    completed: float | None  # tasks completed per second (None: the counter was not read)


@dataclass(frozen=True)
class Verdict:
    judgements: list[Judgement]
    problems: list[str]
    lagging: bool
    leaks: list[str]  # names of the series that grow without bound
    flat_window: tuple[float, float] | None  # when tables were judged, if the backlog grew

    @property
    def kind(self) -> str:
        if self.lagging and self.leaks:
            return "lagging and leak"
        if self.lagging:
            return "lagging"
        return "leak" if self.leaks else "pass"


def flat_window(backlog: Series, half: float, band: float) -> tuple[float, float] | None:
    """The longest run of consecutive samples at or after `half` whose backlog values stay
    within `band` of each other (the earliest such run on a tie), as (first t, last t); None
    when no run holds `MIN_SAMPLES` samples."""
    points = [(t, v) for t, v in backlog.points if t >= half]
    best: tuple[int, int] | None = None
    start = 0
    for end in range(len(points)):
        while start < end and _spread(points[start : end + 1]) > band:
            start += 1
        if best is None or end - start > best[1] - best[0]:
            best = (start, end)
    if best is None or best[1] - best[0] + 1 < MIN_SAMPLES:
        return None
    return points[best[0]][0], points[best[1]][0]


def _spread(points: list[tuple[float, float]]) -> float:
    values = [v for _, v in points]
    return max(values) - min(values)


def _within(series: Series, window: tuple[float, float]) -> Series:
    first, last = window
    return replace(series, points=[(t, v) for t, v in series.points if first <= t <= last])


def _tolerance(series: Series, rate: float) -> Tolerance:
    tolerance = TOLERANCES[series.kind]
    if series.kind == "backlog":
        return Tolerance(tolerance.relative, rate * BACKLOG_FLOOR_SECONDS)
    return tolerance


def _rates(rates: Rates) -> str:
    completed = f"{rates.completed:.1f}" if rates.completed is not None else "?"
    return f"{completed} tasks/s completed against {rates.offered:.1f}/s offered"


def decide(series: Iterable[Series], *, half: float, rate: float, rates: Rates) -> Verdict:
    """Judge every series by the rule of the module doc and say what the run showed."""
    all_series = list(series)
    backlog = next((s for s in all_series if s.kind == "backlog"), None)
    backlog_judgement = (
        judge(backlog, half, _tolerance(backlog, rate)) if backlog is not None else None
    )
    lagging = backlog_judgement is not None and not backlog_judgement.ok
    window: tuple[float, float] | None = None
    if lagging and backlog is not None:
        window = flat_window(backlog, half, rate * BACKLOG_FLOOR_SECONDS)

    judgements: list[Judgement] = []
    for one in all_series:
        if one is backlog and backlog_judgement is not None:
            judgements.append(backlog_judgement)
        elif one.kind not in FOLLOW_THE_BACKLOG or not lagging:
            judgements.append(judge(one, half, _tolerance(one, rate)))
        elif window is None:
            judgements.append(_unjudged_table(one, half, rate))
        else:
            judgements.append(_table_while_flat(one, window, rate))

    leaks = [j.name for j in judgements if not j.ok and j.kind != "backlog"]
    problems: list[str] = []
    if lagging and backlog_judgement is not None:
        growth = backlog_judgement.projected_growth or 0.0
        tables = (
            f"table sizes judged only while the backlog was flat ({window[0]:.0f}-"
            f"{window[1]:.0f} s)"
            if window is not None
            else f"the backlog was never flat for {MIN_SAMPLES} samples, table sizes not judged"
        )
        problems.append(
            f"lagging{'' if leaks else ', not a leak'}: the stack did not keep up with the "
            f"offered load: the Queued backlog grew by {growth:.0f} tasks over the second half "
            f"({_rates(rates)}); {tables}"
        )
    if leaks:
        where = " (tables while the backlog was flat)" if lagging else ""
        problems.append(f"leak: grows without bound{where}: {', '.join(sorted(leaks))}")
    return Verdict(judgements, problems, lagging, sorted(leaks), window)


def _unjudged_table(series: Series, half: float, rate: float) -> Judgement:
    reported = judge(series, half, _tolerance(series, rate))
    return replace(
        reported,
        judged=False,
        ok=True,
        reason="not judged: the Queued backlog grew and was never flat long enough",
    )


def _table_while_flat(series: Series, window: tuple[float, float], rate: float) -> Judgement:
    judgement = judge(_within(series, window), window[0], _tolerance(series, rate))
    if not series.judged or not judgement.judged:
        return judgement
    span = f"{window[0]:.0f}-{window[1]:.0f} s"
    if judgement.ok:
        return replace(judgement, reason=f"bounded while the backlog was flat ({span})")
    return replace(
        judgement,
        reason=f"grows without bound while the backlog was flat ({span}): a leak",
    )

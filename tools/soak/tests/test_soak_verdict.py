"""The soak's verdict on synthetic samples (`taskplat.soak.verdict.decide`): a stack that keeps
up with flat tables passes; a growing backlog with flat tables is `lagging`, not a leak, and says
completed against offered; a table that grows while the backlog is flat is a `leak`, whether the
backlog grows later or not; a process that grows is a leak whatever the backlog; a backlog never
flat leaves the tables unjudged."""

from __future__ import annotations

from collections.abc import Callable

from taskplat.soak.series import MIN_SAMPLES, Judgement, Series
from taskplat.soak.verdict import Rates, decide, flat_window

RATE = 10.0  # tasks/s offered: the backlog's floor is 100 tasks
STEP = 10.0  # seconds between samples
SAMPLES = 60  # 600 s of load; the second half starts at 300 s
HALF = 300.0
KEPT_UP = Rates(offered=10.0, completed=10.0)
BEHIND = Rates(offered=10.0, completed=6.0)
MIB = 1024 * 1024


def _series(name: str, kind: str, value: Callable[[float], float]) -> Series:
    series = Series(name, kind)
    for n in range(SAMPLES):
        series.add(n * STEP, value(n * STEP))
    return series


def _flat_backlog() -> Series:
    return _series("backlog queued tasks", "backlog", lambda t: 40 + (t % 30))


def _growing_backlog() -> Series:
    # 4 tasks/s more offered than completed, from the start.
    return _series("backlog queued tasks", "backlog", lambda t: 4 * t)


def _late_backlog() -> Series:
    # Flat until 450 s, then it grows: the stack fell behind late in the run.
    return _series(
        "backlog queued tasks", "backlog", lambda t: 50 if t < 450 else 50 + 20 * (t - 450)
    )


def _table(value: Callable[[float], float]) -> Series:
    return _series("relation_bytes tasks", "relation_bytes", value)


def _flat_table() -> Series:
    return _table(lambda t: 64 * MIB + (t % 40) * 1024)


def _rss(value: Callable[[float], float] = lambda t: 80 * MIB) -> Series:
    return _series("rss dispatcher", "rss", value)


def _by_name(judgements: list[Judgement]) -> dict[str, Judgement]:
    return {j.name: j for j in judgements}


def test_a_stack_that_keeps_up_with_flat_tables_passes() -> None:
    verdict = decide([_flat_backlog(), _flat_table(), _rss()], half=HALF, rate=RATE, rates=KEPT_UP)
    assert verdict.kind == "pass" and verdict.problems == []
    assert all(j.ok and j.judged for j in verdict.judgements)


def test_a_growing_backlog_with_tables_growing_alongside_is_lagging_not_a_leak() -> None:
    # The tables grow with the backlog (more Queued rows), never while it is flat.
    backlog = _growing_backlog()
    table = _table(lambda t: 64 * MIB + 4 * t * 2048)
    verdict = decide([backlog, table, _rss()], half=HALF, rate=RATE, rates=BEHIND)
    assert verdict.kind == "lagging"
    assert verdict.leaks == [] and verdict.flat_window is None
    [problem] = verdict.problems
    assert problem.startswith("lagging, not a leak: the stack did not keep up")
    assert "6.0 tasks/s completed against 10.0/s offered" in problem
    assert "never flat" in problem
    judged = _by_name(verdict.judgements)
    assert not judged["backlog queued tasks"].ok
    assert judged["relation_bytes tasks"].ok and not judged["relation_bytes tasks"].judged
    assert judged["rss dispatcher"].ok


def test_a_table_growing_while_the_backlog_is_flat_is_a_leak() -> None:
    leaking = _table(lambda t: 64 * MIB + t * 200 * 1024)
    verdict = decide([_flat_backlog(), leaking, _rss()], half=HALF, rate=RATE, rates=KEPT_UP)
    assert verdict.kind == "leak" and verdict.leaks == ["relation_bytes tasks"]
    assert verdict.problems == ["leak: grows without bound: relation_bytes tasks"]


def test_with_a_late_backlog_tables_are_judged_over_its_flat_part() -> None:
    backlog = _late_backlog()
    assert flat_window(backlog, HALF, RATE * 10) == (300.0, 450.0)
    # Flat while the backlog is, growing after it grew: lagging, not a leak.
    follows = _table(lambda t: 64 * MIB if t < 450 else 64 * MIB + (t - 450) * 8 * 2048)
    verdict = decide([backlog, follows], half=HALF, rate=RATE, rates=BEHIND)
    assert verdict.kind == "lagging" and verdict.flat_window == (300.0, 450.0)
    judgement = _by_name(verdict.judgements)["relation_bytes tasks"]
    assert judgement.ok and judgement.judged
    assert judgement.reason == "bounded while the backlog was flat (300-450 s)"
    assert "judged only while the backlog was flat (300-450 s)" in verdict.problems[0]
    # Growing already while the backlog was flat: a leak besides the lag.
    leaking = _table(lambda t: 64 * MIB + t * 200 * 1024)
    both = decide([backlog, leaking], half=HALF, rate=RATE, rates=BEHIND)
    assert both.kind == "lagging and leak"
    assert both.problems[0].startswith("lagging: the stack did not keep up")
    assert both.problems[1] == (
        "leak: grows without bound (tables while the backlog was flat): relation_bytes tasks"
    )
    assert "a leak" in _by_name(both.judgements)["relation_bytes tasks"].reason


def test_a_growing_process_is_a_leak_whatever_the_backlog() -> None:
    growing = _rss(lambda t: 80 * MIB + t * 100 * 1024)
    verdict = decide([_growing_backlog(), growing], half=HALF, rate=RATE, rates=BEHIND)
    assert verdict.kind == "lagging and leak"
    assert verdict.leaks == ["rss dispatcher"]


def test_unknown_completion_and_series_not_judged_by_design() -> None:
    data = Series("relation_bytes dataset", "relation_bytes", judged=False)
    for n in range(SAMPLES):
        data.add(n * STEP, n * 10 * MIB)
    verdict = decide(
        [_growing_backlog(), data], half=HALF, rate=RATE, rates=Rates(offered=10.0, completed=None)
    )
    assert verdict.kind == "lagging"
    assert "? tasks/s completed against 10.0/s offered" in verdict.problems[0]
    assert _by_name(verdict.judgements)["relation_bytes dataset"].ok


def test_a_flat_window_needs_enough_samples() -> None:
    backlog = Series("backlog queued tasks", "backlog")
    for n in range(SAMPLES):
        # Flat for MIN_SAMPLES - 1 samples at a time, then a jump.
        backlog.add(n * STEP, (n // (MIN_SAMPLES - 1)) * 1000.0)
    assert flat_window(backlog, HALF, RATE * 10) is None

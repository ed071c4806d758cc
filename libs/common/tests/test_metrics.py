"""Metrics recorded with prometheus_client keep the exposition the services' scrapers read: the
text below is what the OpenTelemetry Prometheus exporter wrote for the same measurements (names
and suffixes, HELP, sorted labels with "" for a missing one, JSON label values, cumulative buckets,
gauges), and recording stays exact under threads and bounded in label sets."""

from __future__ import annotations

import math
import threading

import pytest
from opentelemetry.metrics import CallbackOptions, Observation

from taskplat.common import metrics
from taskplat.common.telemetry import SIZE_BUCKETS, Metric, Telemetry

EXPECTED = """\
# HELP taskplat_tasks_created_total Tasks created.
# TYPE taskplat_tasks_created_total counter
taskplat_tasks_created_total{b="",f="",n="",operator="op",queue="q"} 3.0
taskplat_tasks_created_total{b="",f="",n="",operator="",queue="q2"} 1.0
taskplat_tasks_created_total{b="true",f="1.5",n="5",operator="",queue="q2"} 1.0
# HELP taskplat_task_run_time_seconds Run.
# TYPE taskplat_task_run_time_seconds histogram
taskplat_task_run_time_seconds_bucket{le="0.001",queue="q"} 0.0
taskplat_task_run_time_seconds_bucket{le="0.0025",queue="q"} 0.0
taskplat_task_run_time_seconds_bucket{le="0.005",queue="q"} 1.0
taskplat_task_run_time_seconds_bucket{le="0.01",queue="q"} 1.0
taskplat_task_run_time_seconds_bucket{le="0.025",queue="q"} 1.0
taskplat_task_run_time_seconds_bucket{le="0.05",queue="q"} 1.0
taskplat_task_run_time_seconds_bucket{le="0.1",queue="q"} 1.0
taskplat_task_run_time_seconds_bucket{le="0.25",queue="q"} 1.0
taskplat_task_run_time_seconds_bucket{le="0.5",queue="q"} 1.0
taskplat_task_run_time_seconds_bucket{le="1",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="2.5",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="5",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="10",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="30",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="60",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="300",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="900",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="3600",queue="q"} 3.0
taskplat_task_run_time_seconds_bucket{le="+Inf",queue="q"} 3.0
taskplat_task_run_time_seconds_count{queue="q"} 3.0
taskplat_task_run_time_seconds_sum{queue="q"} 2.003
# HELP taskplat_loop_batch_size B
# TYPE taskplat_loop_batch_size histogram
taskplat_loop_batch_size_bucket{le="0"} 0.0
taskplat_loop_batch_size_bucket{le="1"} 0.0
taskplat_loop_batch_size_bucket{le="2"} 0.0
taskplat_loop_batch_size_bucket{le="5"} 1.0
taskplat_loop_batch_size_bucket{le="10"} 1.0
taskplat_loop_batch_size_bucket{le="25"} 1.0
taskplat_loop_batch_size_bucket{le="50"} 1.0
taskplat_loop_batch_size_bucket{le="100"} 1.0
taskplat_loop_batch_size_bucket{le="250"} 1.0
taskplat_loop_batch_size_bucket{le="500"} 1.0
taskplat_loop_batch_size_bucket{le="1000"} 1.0
taskplat_loop_batch_size_bucket{le="+Inf"} 1.0
taskplat_loop_batch_size_count 1.0
taskplat_loop_batch_size_sum 3.0
# HELP taskplat_worker_busy busy
# TYPE taskplat_worker_busy gauge
taskplat_worker_busy 1.0
# HELP taskplat_tasks_current cur
# TYPE taskplat_tasks_current gauge
taskplat_tasks_current{status="Queued"} 3.0
taskplat_tasks_current{status=""} 1.5
"""


def _current(_options: CallbackOptions) -> list[Observation]:
    return [Observation(3, {"status": "Queued"}), Observation(1.5)]


def test_the_exposition_is_the_one_the_opentelemetry_exporter_wrote() -> None:
    telemetry = Telemetry("metrics-test")
    created = telemetry.counter("taskplat.tasks.created", description="Tasks created.")
    created.add(1, {"queue": "q", "operator": "op"})
    created.add(2, {"operator": "op", "queue": "q"})  # the same series, keys in another order
    created.add(1, {"queue": "q2", "dropped": None})
    created.add(1, {"queue": "q2", "n": 5, "b": True, "f": 1.5})
    run_time = telemetry.histogram("taskplat.task.run_time", description="Run.")
    for value in (0.003, 1, 1.0):  # a value on a bound lands in that bound's bucket
        run_time.record(value, {"queue": "q"})
    sizes = telemetry.histogram(
        "taskplat.loop.batch_size", unit="1", description="B", buckets=SIZE_BUCKETS
    )
    sizes.record(3)
    busy = telemetry.up_down_counter("taskplat.worker.busy", description="busy")
    for delta in (1, -1, 1):
        busy.add(delta)
    telemetry.counter("taskplat.never", description="never recorded: not exposed")
    telemetry.observable_gauge("taskplat.tasks.current", [_current], description="cur")

    assert telemetry.prometheus_text().decode() == EXPECTED


def test_an_instrument_created_twice_is_the_same_and_another_kind_is_refused() -> None:
    telemetry = Telemetry("metrics-test")
    first = telemetry.counter("taskplat.loop.batches", description="Batches.")
    again = telemetry.counter("taskplat.loop.batches", description="Batches.")
    assert first is again
    first.add(1, {"loop": "a"})
    again.add(1, {"loop": "a"})
    assert 'taskplat_loop_batches_total{loop="a"} 2.0' in telemetry.prometheus_text().decode()
    with pytest.raises(ValueError, match="exists as a Counter"):
        telemetry.histogram("taskplat.loop.batches", unit="1")
    with pytest.raises(ValueError, match="unsupported metric unit"):
        telemetry.counter("taskplat.odd", unit="furlongs")


def test_amounts_the_sdk_refused_are_dropped_and_up_down_counters_go_down() -> None:
    telemetry = Telemetry("metrics-test")
    counter = telemetry.counter("taskplat.c")
    histogram = telemetry.histogram("taskplat.h")
    gauge = telemetry.up_down_counter("taskplat.g")
    for amount in (2, -1, math.nan, math.inf):
        counter.add(amount)
        histogram.record(amount)
    for amount in (2, -3, math.nan, -math.inf):
        gauge.add(amount)
    text = telemetry.prometheus_text().decode()
    assert "taskplat_c_total 2.0" in text
    assert "taskplat_h_seconds_count 1.0" in text
    assert "taskplat_h_seconds_sum 2.0" in text
    assert "taskplat_g -1.0" in text


def test_concurrent_recording_loses_nothing() -> None:
    telemetry = Telemetry("metrics-test")
    counter = telemetry.counter("taskplat.c")
    histogram = telemetry.histogram("taskplat.h")
    threads, per_thread = 4, 20_000

    def record() -> None:
        for i in range(per_thread):
            counter.add(1, {"queue": f"q{i % 3}"})
            histogram.record(0.002, {"queue": "q"})

    workers = [threading.Thread(target=record) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    text = telemetry.prometheus_text().decode()
    total = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("taskplat_c_total{")
    )
    assert total == threads * per_thread
    assert f'taskplat_h_seconds_count{{queue="q"}} {float(threads * per_thread)}' in text


def test_label_sets_beyond_the_limit_share_one_overflow_series(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "CARDINALITY_LIMIT", 3)
    telemetry = Telemetry("metrics-test")
    counter = telemetry.counter("taskplat.c")
    for i in range(5):
        counter.add(1, {"id": str(i)})
    counter.add(1, {"id": "0"})  # a known label set still counts in its own series
    lines = [
        line for line in telemetry.prometheus_text().decode().splitlines() if "_total{" in line
    ]
    assert lines == [
        'taskplat_c_total{id="0",otel_metric_overflow=""} 2.0',
        'taskplat_c_total{id="1",otel_metric_overflow=""} 1.0',
        'taskplat_c_total{id="",otel_metric_overflow="true"} 3.0',
    ]


def test_a_failing_gauge_callback_skips_only_its_gauge() -> None:
    telemetry = Telemetry("metrics-test")

    def broken(_options: CallbackOptions) -> list[Observation]:
        raise RuntimeError("database gone")

    telemetry.observable_gauge("taskplat.broken", [broken])
    telemetry.counter("taskplat.c").add(1)
    text = telemetry.prometheus_text().decode()
    assert "taskplat_broken" not in text
    assert "taskplat_c_total 1.0" in text


def test_an_unhashable_attribute_value_is_a_json_label() -> None:
    telemetry = Telemetry("metrics-test")
    counter = telemetry.counter("taskplat.c")
    counter.add(1, {"tags": ["a", "b"]})
    counter.add(1, {"tags": ["a", "b"]})
    assert 'taskplat_c_total{tags="[\\"a\\", \\"b\\"]"} 2.0' in telemetry.prometheus_text().decode()


def test_a_label_the_declaration_does_not_name_is_noted_and_still_recorded() -> None:
    telemetry = Telemetry("metrics-test")
    declared = Metric("taskplat.declared", "counter", "Declared.", labels=("queue",))
    counter = telemetry.counter(declared)
    gauge = Metric("taskplat.gauge", "observable_gauge", "Gauge.", labels=("queue",))
    telemetry.observable_gauge(gauge, [lambda _: [Observation(1, {"queue": "q", "id": "7"})]])
    try:
        counter.add(1, {"queue": "q"})
        counter.add(1, {"queue": "q", "worker": None})  # a None attribute is no label
        assert metrics.undeclared_labels() == []
        counter.add(1, {"queue": "q", "task_id": "t1"})
        counter.add(1, {"queue": "q", "task_id": "t2"})  # noted once
        text = telemetry.prometheus_text().decode()
        assert metrics.undeclared_labels() == [
            ("taskplat_declared", ("task_id",)),
            ("taskplat_gauge", ("id",)),
        ]
        assert 'taskplat_declared_total{queue="q",task_id="t2"} 1.0' in text
    finally:
        metrics.clear_undeclared_labels()  # noted on purpose: not this test's failure


def test_a_declaration_of_another_kind_is_refused() -> None:
    telemetry = Telemetry("metrics-test")
    with pytest.raises(ValueError, match="declared a histogram"):
        telemetry.counter(Metric("taskplat.h", "histogram", "H.", unit="s"))

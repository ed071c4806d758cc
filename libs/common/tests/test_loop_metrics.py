"""The loop's per-batch metrics as Prometheus shows them: the batches counter tells full batches
from the others (the loops' saturation signal, scraped by the ECS collector)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from taskplat.common.loops import run_loop
from taskplat.common.telemetry import Telemetry


@dataclass(frozen=True)
class _Batch:
    handled: int
    more: bool


def _samples(telemetry: Telemetry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = telemetry.prometheus_text().decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_batches_are_counted_by_fullness() -> None:
    telemetry = Telemetry("loop-test")
    stop = threading.Event()
    results = iter([_Batch(10, True), _Batch(10, True), _Batch(3, False)])

    def run_once() -> _Batch:
        result = next(results)
        if not result.more:
            stop.set()
        return result

    run_loop("demo", run_once, stop, interval=0.0, telemetry=telemetry)
    assert _samples(telemetry, "taskplat_loop_batches_total") == {
        (("full", "true"), ("loop", "demo")): 2.0,
        (("full", "false"), ("loop", "demo")): 1.0,
    }

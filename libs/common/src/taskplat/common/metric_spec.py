"""The declaration of one metric: the name its instrument is created under, its kind, unit, labels
and meaning.

Invariants:
  * Every instrument a service creates comes from a `Metric` declared in its package's
    `metric_specs` module (`Telemetry.counter(TASKS_CREATED)`, ...), the one place that names its
    labels; tests/docs/test_metric_specs.py reads the sources to check no instrument is created from
    a bare name. docs/reference/metrics.md is generated from these declarations when the site is
    built (tools/docs_site/hooks.py).
  * The instrument keeps the declared labels: a measurement carrying another label is noted
    (`taskplat.common.metrics.undeclared_labels`), and the test suite fails on it (conftest.py).
  * `exposed_name` is the name the Prometheus exposition gives the metric: dots as `_`, the unit's
    suffix (`_seconds`), `_total` on counters.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

from taskplat.common.metrics import metric_name, unit_suffix

# Each package's declarations (its `metric_specs` module, with a `METRICS` tuple), by process.
CATALOGS: tuple[tuple[str, str], ...] = (
    ("Dispatcher", "taskplat.dispatcher.metric_specs"),
    ("Outbox relay", "taskplat.outbox_relay.metric_specs"),
    ("Scheduler", "taskplat.scheduler.metric_specs"),
    ("Reaper", "taskplat.reaper.metric_specs"),
    ("Sink", "taskplat.sink.metric_specs"),
    ("Worker wrapper", "taskplat.worker_wrapper.metric_specs"),
    ("Credential broker", "taskplat.credential_broker.metric_specs"),
    ("Query service", "taskplat.query_service.metric_specs"),
    ("Shared by several services", "taskplat.common.metric_specs"),
)

Kind = Literal["counter", "up_down_counter", "histogram", "observable_gauge"]

# The Prometheus type each kind is exposed as.
PROMETHEUS_TYPES: dict[str, str] = {
    "counter": "counter",
    "up_down_counter": "gauge",
    "histogram": "histogram",
    "observable_gauge": "gauge",
}


@dataclass(frozen=True)
class Metric:
    """One metric: `description` is its HELP text, `doc` the longer meaning for the reference."""

    name: str
    kind: Kind
    description: str
    labels: tuple[str, ...] = ()
    unit: str = "1"
    doc: str = ""

    @property
    def exposed_name(self) -> str:
        name = metric_name(self.name)
        suffix = unit_suffix(self.unit)
        if suffix and not name.endswith(f"_{suffix}"):
            name = f"{name}_{suffix}"
        return f"{name}_total" if self.kind == "counter" else name

    @property
    def prometheus_type(self) -> str:
        return PROMETHEUS_TYPES[self.kind]


def declared_metrics() -> list[tuple[str, tuple[Metric, ...]]]:
    """(title, declarations) of every catalog in `CATALOGS`, imported by name (the services
    depend on this library, not the other way round)."""
    found: list[tuple[str, tuple[Metric, ...]]] = []
    for title, module in CATALOGS:
        metrics: tuple[Metric, ...] = importlib.import_module(module).METRICS
        found.append((title, metrics))
    return found

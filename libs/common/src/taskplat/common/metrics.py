"""Metric instruments recorded straight into a `prometheus_client` collector.

The services call `add`/`record` on the instruments `Telemetry` creates, as they did with the
OpenTelemetry metrics SDK; recording is now a dictionary look-up and an addition under the
instrument's lock (the SDK's aggregation took a sixth of the dispatcher's CPU under load, see
docs/performance.md). OpenTelemetry stays for traces.

Invariants:
  * The exposition is the one the OpenTelemetry Prometheus exporter wrote: the name with dots and
    other invalid characters as `_`, the unit as a suffix (`s` -> `_seconds`, `1` -> none) and
    `_total` on counters; the description as HELP; label names sorted, every series of a metric
    carrying every label its metric was recorded with (`""` where a measurement had none);
    non-string label values as JSON (`5`, `true`); up-down counters and observed gauges typed
    `gauge`; histogram buckets cumulative, `le` written as the boundary was given. A metric with no
    measurement yet is not exposed.
  * Attributes whose value is None are dropped, as the SDK dropped them; so is a measurement the
    SDK refused (a NaN or infinite amount; a negative one on a counter or a histogram), logged.
  * A metric keeps at most `CARDINALITY_LIMIT` label sets (the SDK's bound); measurements with a
    further label set go to one series labelled `otel_metric_overflow="true"`, so memory stays
    bounded whatever a caller passes.
  * Every method is thread-safe; a gauge callback runs only at a scrape, and one that raises is
    logged and skipped without failing the scrape.
  * An instrument given its declared labels (`taskplat.common.metric_spec.Metric`) checks each new
    label set against them (off the hot path: only when a label set is first met); a label it did
    not declare is logged once and kept in `undeclared_labels()`, and the measurement is still
    recorded, so a metric never fails its caller. The test suite fails on any (conftest.py).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

CARDINALITY_LIMIT = 2000
_OVERFLOW: tuple[tuple[str, str], ...] = (("otel_metric_overflow", "true"),)
_UNITS = {"1": "", "s": "seconds", "ms": "milliseconds", "By": "bytes"}
_INVALID_NAME = re.compile(r"[^a-zA-Z0-9:]+")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9]+")

Attributes = Mapping[str, Any] | None
Labels = tuple[tuple[str, str], ...]
GaugeCallback = Callable[[CallbackOptions], Iterable[Observation]]

_log = logging.getLogger(__name__)

_undeclared: dict[tuple[str, tuple[str, ...]], None] = {}
_undeclared_lock = threading.Lock()


def undeclared_labels() -> list[tuple[str, tuple[str, ...]]]:
    """(metric, label names) of every measurement so far that carried labels its metric's
    declaration does not name, in the order first met."""
    with _undeclared_lock:
        return list(_undeclared)


def clear_undeclared_labels() -> None:
    """Forget what `undeclared_labels()` lists (tests: between one test and the next)."""
    with _undeclared_lock:
        _undeclared.clear()


def _declared(labels: Sequence[str] | None) -> frozenset[str] | None:
    if labels is None:
        return None
    return frozenset({_label_name(label) for label in labels} | {_OVERFLOW[0][0]})


def _check_labels(metric: str, declared: frozenset[str] | None, labels: Labels) -> None:
    """Note the labels of a new label set that `declared` (None: no declaration) lacks."""
    if declared is None:
        return
    extra = tuple(name for name, _ in labels if name not in declared)
    if not extra:
        return
    with _undeclared_lock:
        if (metric, extra) in _undeclared:
            return
        _undeclared[(metric, extra)] = None
    _log.warning("metric %s: labels %s not declared", metric, ", ".join(extra))


def metric_name(name: str) -> str:
    """The Prometheus name of an instrument name (`taskplat.tasks.created` ->
    `taskplat_tasks_created`), before the unit and `_total` suffixes."""
    if name and name[0].isdigit():
        name = "_" + name[1:]
    return _INVALID_NAME.sub("_", name)


def unit_suffix(unit: str) -> str:
    """The name suffix of a unit; a unit without one is refused at the instrument's creation."""
    try:
        return _UNITS[unit]
    except KeyError:
        raise ValueError(f"unsupported metric unit {unit!r} (one of {sorted(_UNITS)})") from None


def _label_name(key: str) -> str:
    if key and key[0].isdigit():
        key = "_" + key[1:]
    return _INVALID_LABEL.sub("_", key)


def _label_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _labels(attributes: Attributes) -> Labels:
    """The sorted (label name, label value) pairs of one measurement's attributes."""
    if not attributes:
        return ()
    return tuple(
        sorted(
            (_label_name(key), _label_value(value))
            for key, value in attributes.items()
            if value is not None
        )
    )


class _Series:
    """The label sets of one instrument and their cells, bounded by CARDINALITY_LIMIT."""

    def __init__(self, new_cell: Callable[[], list[Any]], check: Callable[[Labels], None]) -> None:
        self.lock = threading.Lock()
        self._new_cell = new_cell
        self._check = check
        self._by_raw: dict[tuple[Any, ...], list[Any]] = {}
        self._by_labels: dict[Labels, list[Any]] = {}

    def cell(self, attributes: Attributes) -> list[Any]:
        """The cell of these attributes; call with `self.lock` held."""
        raw: tuple[Any, ...] = tuple(attributes.items()) if attributes else ()
        try:
            found = self._by_raw.get(raw)
        except TypeError:  # an unhashable value (a list): key on its label form instead
            raw = (_labels(attributes),)
            found = self._by_raw.get(raw)
        if found is not None:
            return found
        labels = _labels(attributes)
        found = self._by_labels.get(labels)
        if found is None:
            self._check(labels)
            if len(self._by_labels) >= CARDINALITY_LIMIT - 1 and labels != _OVERFLOW:
                labels = _OVERFLOW
                found = self._by_labels.get(labels)
            if found is None:
                found = self._new_cell()
                self._by_labels[labels] = found
        if len(self._by_raw) < 4 * CARDINALITY_LIMIT:
            self._by_raw[raw] = found
        return found

    def snapshot(self) -> list[tuple[Labels, list[Any]]]:
        with self.lock:
            return [(labels, list(cell)) for labels, cell in self._by_labels.items()]


def _label_rows(
    series: Sequence[tuple[Labels, Any]],
) -> tuple[list[str], list[tuple[list[str], Any]]]:
    """The sorted label names of all series, and each series' values in that order."""
    names = sorted({name for labels, _ in series for name, _ in labels})
    rows = []
    for labels, value in series:
        given = dict(labels)
        rows.append(([given.get(name, "") for name in names], value))
    return names, rows


class _Instrument:
    def __init__(
        self, name: str, unit: str, description: str, labels: Sequence[str] | None = None
    ) -> None:
        self.name = metric_name(name)
        self.unit = unit_suffix(unit)
        self.description = description
        self._declared = _declared(labels)

    def _check(self, labels: Labels) -> None:
        _check_labels(self.name, self._declared, labels)

    def collect(self) -> Metric | None:
        raise NotImplementedError


class Counter(_Instrument):
    """A monotonic sum."""

    def __init__(
        self, name: str, unit: str, description: str, labels: Sequence[str] | None = None
    ) -> None:
        super().__init__(name, unit, description, labels)
        self._series = _Series(lambda: [0], self._check)

    _family: type[CounterMetricFamily | GaugeMetricFamily] = CounterMetricFamily

    @staticmethod
    def _accepts(amount: float) -> bool:
        return 0 <= amount < math.inf  # also false for NaN

    def add(self, amount: float, attributes: Attributes = None) -> None:
        if not self._accepts(amount):
            _log.warning("metric %s: amount %s dropped", self.name, amount)
            return
        series = self._series
        with series.lock:
            series.cell(attributes)[0] += amount

    def collect(self) -> Metric | None:
        snapshot = self._series.snapshot()
        if not snapshot:
            return None
        names, rows = _label_rows(snapshot)
        family = self._family(self.name, self.description, labels=names, unit=self.unit)
        for values, cell in rows:
            family.add_metric(values, cell[0])
        return family


class UpDownCounter(Counter):
    """A sum that may go down, exposed as a gauge."""

    _family = GaugeMetricFamily

    @staticmethod
    def _accepts(amount: float) -> bool:
        return math.isfinite(amount)


class Histogram(_Instrument):
    """Explicit-bucket histogram: a value lands in the first bucket whose bound is >= it."""

    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        buckets: Sequence[float],
        labels: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name, unit, description, labels)
        self._bounds = tuple(buckets)
        self._les = [f"{bound}" for bound in self._bounds] + ["+Inf"]
        width = len(self._bounds) + 1
        # cell: [sum, count of bucket 0, ..., count of the +Inf bucket]
        self._series = _Series(lambda: [0] + [0] * width, self._check)

    def record(self, amount: float, attributes: Attributes = None) -> None:
        if not 0 <= amount < math.inf:  # also false for NaN
            _log.warning("metric %s: amount %s dropped", self.name, amount)
            return
        index = bisect_left(self._bounds, amount) + 1
        series = self._series
        with series.lock:
            cell = series.cell(attributes)
            cell[0] += amount
            cell[index] += 1

    def collect(self) -> Metric | None:
        snapshot = self._series.snapshot()
        if not snapshot:
            return None
        names, rows = _label_rows(snapshot)
        family = HistogramMetricFamily(self.name, self.description, labels=names, unit=self.unit)
        for values, cell in rows:
            total = 0
            buckets = []
            for le, count in zip(self._les, cell[1:], strict=True):
                total += count
                buckets.append((le, total))
            family.add_metric(values, buckets, cell[0])
        return family


class ObservableGauge(_Instrument):
    """A gauge whose values the callbacks observe at each scrape."""

    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        callbacks: Sequence[GaugeCallback],
        labels: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name, unit, description, labels)
        self._callbacks = list(callbacks)

    def collect(self) -> Metric | None:
        observed: dict[Labels, float] = {}
        for callback in self._callbacks:
            try:
                for observation in callback(CallbackOptions()):
                    observed[_labels(observation.attributes)] = observation.value
            except Exception:
                _log.exception("metric %s: gauge callback failed", self.name)
        if not observed:
            return None
        for labels in observed:
            self._check(labels)
        names, rows = _label_rows(list(observed.items()))
        family = GaugeMetricFamily(self.name, self.description, labels=names, unit=self.unit)
        for values, value in rows:
            family.add_metric(values, value)
        return family


class InstrumentCollector:
    """A `prometheus_client` collector exposing the instruments of one `Telemetry`."""

    def __init__(self) -> None:
        self._instruments: list[_Instrument] = []
        self._lock = threading.Lock()

    def add(self, instrument: _Instrument) -> None:
        with self._lock:
            self._instruments.append(instrument)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            instruments = list(self._instruments)
        for instrument in instruments:
            family = instrument.collect()
            if family is not None:
                yield family

"""Metrics and traces of one Taskplat process.

Invariants:
  * Each `Telemetry` owns its instruments and its Prometheus registry (never the global ones), so
    several instances in one process (tests) never mix their counts; `prometheus_text()` is the
    exposition of exactly this instance.
  * Metrics are recorded with `prometheus_client` through `taskplat.common.metrics`, not the
    OpenTelemetry metrics SDK (too costly per measurement on the hot paths); the exposition is the
    one the OpenTelemetry Prometheus exporter wrote. Creating an instrument whose name exists
    returns the existing one (as the SDK did); the same name with another kind is refused.
  * The services create every instrument from its declaration (`Metric`, in their package's
    `metric_specs` module), which names its labels (taskplat.common.metric_spec); a bare name is
    accepted (tests), with no labels declared to check against.
  * Tracing is off and free unless an OTLP endpoint is configured (or a span exporter is passed in,
    as tests do): the tracer is then a no-op and `inject()` writes nothing.
  * Trace context crosses process boundaries only as W3C `traceparent`/`tracestate` strings: in HTTP
    headers, SQS message attributes and the outbox row's `trace_context`.
  * Durations are recorded in seconds, with bucket boundaries suited to the platform's latencies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from taskplat.common.metric_spec import Kind, Metric
from taskplat.common.metrics import (
    Counter,
    GaugeCallback,
    Histogram,
    InstrumentCollector,
    ObservableGauge,
    UpDownCounter,
    metric_name,
    unit_suffix,
)

# Seconds: from a millisecond HTTP call to a long operator run.
LATENCY_BUCKETS: Sequence[float] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
)  # fmt: skip
# Counts per batch (loop batch sizes).
SIZE_BUCKETS: Sequence[float] = (0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_PROPAGATOR = TraceContextTextMapPropagator()

_InstrumentT = TypeVar("_InstrumentT", Counter, UpDownCounter, Histogram, ObservableGauge)

__all__ = [
    "LATENCY_BUCKETS",
    "PROMETHEUS_CONTENT_TYPE",
    "SIZE_BUCKETS",
    "Counter",
    "Histogram",
    "Metric",
    "ObservableGauge",
    "Telemetry",
    "TelemetrySettings",
    "UpDownCounter",
    "extract",
    "inject",
]


class TelemetrySettings(BaseSettings):
    """Trace export fragment (metrics are always on and cost only memory)."""

    model_config = SettingsConfigDict(
        extra="ignore", frozen=True, case_sensitive=False, populate_by_name=True
    )

    otlp_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_ENDPOINT"),
        description="OTLP/HTTP collector base URL (e.g. http://collector:4318); unset = no traces.",
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        validation_alias=AliasChoices("TASKPLAT_TRACE_SAMPLE_RATIO"),
        description="Share of new traces sampled (children follow their parent's decision).",
    )


class Telemetry:
    """The metrics registry and tracer of one service process."""

    def __init__(
        self,
        service: str,
        settings: TelemetrySettings | None = None,
        *,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        settings = settings or TelemetrySettings()
        self.service = service
        resource = Resource.create({"service.name": f"taskplat-{service}"})
        self.registry = CollectorRegistry(auto_describe=True)
        self._collector = InstrumentCollector()
        self.registry.register(self._collector)
        self._instruments: dict[str, Counter | UpDownCounter | Histogram | ObservableGauge] = {}
        self._instruments_lock = threading.Lock()
        self._tracer_provider: TracerProvider | None = None
        exporter = span_exporter or _otlp_exporter(settings.otlp_endpoint)
        if exporter is not None:
            self._tracer_provider = TracerProvider(
                resource=resource,
                sampler=ParentBased(TraceIdRatioBased(settings.trace_sample_ratio)),
            )
            self._tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
            self.tracer: trace.Tracer = self._tracer_provider.get_tracer(f"taskplat.{service}")
        else:
            self.tracer = trace.NoOpTracer()

    @property
    def tracing(self) -> bool:
        return self._tracer_provider is not None

    def counter(self, name: str | Metric, *, unit: str = "1", description: str = "") -> Counter:
        """The counter of a declaration (or, in tests, of a bare name)."""
        spec = _spec(name, "counter", unit, description)
        return self._instrument(
            Counter,
            spec.name,
            spec.unit,
            lambda: Counter(spec.name, spec.unit, spec.description, _labels(name)),
        )

    def up_down_counter(
        self, name: str | Metric, *, unit: str = "1", description: str = ""
    ) -> UpDownCounter:
        spec = _spec(name, "up_down_counter", unit, description)
        return self._instrument(
            UpDownCounter,
            spec.name,
            spec.unit,
            lambda: UpDownCounter(spec.name, spec.unit, spec.description, _labels(name)),
        )

    def histogram(
        self,
        name: str | Metric,
        *,
        unit: str = "s",
        description: str = "",
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        spec = _spec(name, "histogram", unit, description)
        return self._instrument(
            Histogram,
            spec.name,
            spec.unit,
            lambda: Histogram(spec.name, spec.unit, spec.description, buckets, _labels(name)),
        )

    def observable_gauge(
        self,
        name: str | Metric,
        callbacks: Sequence[GaugeCallback],
        *,
        unit: str = "1",
        description: str = "",
    ) -> ObservableGauge:
        spec = _spec(name, "observable_gauge", unit, description)
        return self._instrument(
            ObservableGauge,
            spec.name,
            spec.unit,
            lambda: ObservableGauge(
                spec.name, spec.unit, spec.description, callbacks, _labels(name)
            ),
        )

    def _instrument(
        self, kind: type[_InstrumentT], name: str, unit: str, create: Callable[[], _InstrumentT]
    ) -> _InstrumentT:
        """The instrument exposed under this name: the existing one, else a new one."""
        exposed = metric_name(name) + "|" + unit_suffix(unit)
        with self._instruments_lock:
            existing = self._instruments.get(exposed)
            if existing is None:
                instrument = create()
                self._instruments[exposed] = instrument
                self._collector.add(instrument)
                return instrument
        if type(existing) is not kind:  # exact: an UpDownCounter is a Counter subclass
            raise ValueError(
                f"metric {name!r} exists as a {type(existing).__name__}, not a {kind.__name__}"
            )
        return existing

    def prometheus_text(self) -> bytes:
        """The Prometheus text exposition of this process's metrics."""
        return generate_latest(self.registry)

    def force_flush(self) -> None:
        if self._tracer_provider is not None:
            self._tracer_provider.force_flush()

    def shutdown(self) -> None:
        if self._tracer_provider is not None:
            self._tracer_provider.shutdown()


def _spec(name: str | Metric, kind: Kind, unit: str, description: str) -> Metric:
    """The declaration of an instrument: `name` itself, or one made of a bare name's arguments."""
    if isinstance(name, Metric):
        if name.kind != kind:
            raise ValueError(f"metric {name.name!r} is declared a {name.kind}, not a {kind}")
        return name
    return Metric(name, kind, description, unit=unit)


def _labels(name: str | Metric) -> tuple[str, ...] | None:
    """The declared labels (None for a bare name: nothing declared to check against)."""
    return name.labels if isinstance(name, Metric) else None


def _otlp_exporter(endpoint: str | None) -> SpanExporter | None:
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")


def inject(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """The W3C trace context of `ctx` (default: the current one) as strings; empty when none."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context:
    """A context whose parent is the span named by `carrier` (`traceparent`/`tracestate`)."""
    return _PROPAGATOR.extract(dict(carrier or {}))

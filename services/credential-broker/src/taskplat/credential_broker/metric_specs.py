"""The metrics of the credential broker: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

BROKER_REQUESTS = Metric(
    "taskplat.broker.requests",
    "counter",
    "POST /credentials answers by outcome",
    labels=("outcome",),
    doc="`POST /credentials` answers: `issued`, `rate_limited`, or the error code of a refusal.",
)

METRICS: tuple[Metric, ...] = (BROKER_REQUESTS,)

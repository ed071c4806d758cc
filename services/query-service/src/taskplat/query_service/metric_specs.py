"""The metrics of the query service: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

QUERY_REQUESTS = Metric(
    "taskplat.query.requests",
    "counter",
    "POST /query answers by outcome",
    labels=("outcome",),
    doc=(
        "`POST /query` answers: `answered`, `rate_limited`, `too_many_running`, or the error code "
        "of a refusal (`refused`, `invalid_sql`, `query_timeout`, `query_failed`, `invalid_token`, "
        "...)."
    ),
)

QUERY_ENGINES_OPENED = Metric(
    "taskplat.query.engines_opened",
    "counter",
    "Sandboxes given inputs (one per query that passed the guard)",
    doc=(
        "Sandboxes given inputs (a fresh DuckDB in its own process): one per query that passed the "
        "statement guard (the guard decides inside a sandbox; a refused statement is given no "
        "input)."
    ),
)

QUERY_DURATION = Metric(
    "taskplat.query.duration",
    "histogram",
    "Run time of admitted queries",
    unit="s",
    doc="Run time of admitted queries (inputs, guard, DuckDB, answer).",
)

METRICS: tuple[Metric, ...] = (
    QUERY_REQUESTS,
    QUERY_ENGINES_OPENED,
    QUERY_DURATION,
)

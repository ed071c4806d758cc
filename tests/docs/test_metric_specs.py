"""Every metric is declared once (a package's `metric_specs` module) and created from that
declaration, so the generated reference (docs/reference/metrics.md) lists exactly what the code
exports, with the labels it records.

Checked here: each `Telemetry` instrument call in the packages' sources (libs/*/src, services/*/src)
passes a declaration imported from a `metric_specs` module (read with `ast`: a call given a bare
name fails), every declaration of a catalog is created somewhere in its package, the name each
declaration predicts is the one the Prometheus exposition really gives it, and the exposed names
are the ones dashboards and alarms read. That measurements carry only declared labels is checked
on every test (conftest.py).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from opentelemetry.metrics import CallbackOptions, Observation

from taskplat.common.metric_spec import CATALOGS, Metric, declared_metrics
from taskplat.common.telemetry import Telemetry

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"counter", "histogram", "up_down_counter", "observable_gauge"}

# The exposed names, a contract with dashboards, alarms and scaling policies: a rename shows here.
EXPOSED = set(
    """
    taskplat_broker_requests_total taskplat_bulk_replays_total taskplat_claims_limited_total
    taskplat_claims_not_claimed_total taskplat_claims_refused_total taskplat_claims_waiting
    taskplat_dags_applied_total taskplat_deadlines_exceeded_total
    taskplat_dispatcher_call_errors_total taskplat_dispatcher_calls_total
    taskplat_events_received_total taskplat_events_routed_total
    taskplat_events_routing_lag_seconds taskplat_events_tasks_created_total
    taskplat_heartbeats_total taskplat_http_server_duration_seconds
    taskplat_lambda_invocations_total taskplat_leases_expired_total
    taskplat_loop_batch_duration_seconds taskplat_loop_batch_size taskplat_loop_batches_total
    taskplat_loop_errors_total taskplat_operator_crashes_total taskplat_operator_kills_total
    taskplat_operator_run_time_seconds taskplat_operator_starts_total
    taskplat_outbox_deferred_total taskplat_outbox_held_total taskplat_outbox_oldest_age_seconds
    taskplat_outbox_pending taskplat_outbox_pruned_total taskplat_outbox_relayed_total
    taskplat_outbox_skipped_total taskplat_query_duration_seconds
    taskplat_query_engines_opened_total taskplat_query_requests_total
    taskplat_queue_oldest_age_seconds taskplat_queue_pauses_total taskplat_queue_running
    taskplat_queue_sqs_holds_total taskplat_queue_sqs_probes_total taskplat_queues_sqs_missing
    taskplat_schedules_runs_started_total taskplat_sink_buffer_age_seconds
    taskplat_sink_buffer_messages taskplat_sink_dead_lettered_total
    taskplat_sink_duplicates_skipped_total taskplat_sink_events_total
    taskplat_sink_records_written_total taskplat_sqs_deleted_total taskplat_sqs_errors_total
    taskplat_sqs_received_total taskplat_sqs_requests_total taskplat_sqs_send_errors_total
    taskplat_sqs_sent_total taskplat_task_enqueue_to_start_seconds taskplat_task_run_time_seconds
    taskplat_task_schedule_lag_seconds taskplat_tasks_canceled_total taskplat_tasks_claimed_total
    taskplat_tasks_completed_total taskplat_tasks_created_total taskplat_tasks_current
    taskplat_tasks_dead_last_hour taskplat_tasks_dead_total taskplat_tasks_expired_total
    taskplat_tasks_failed_total taskplat_tasks_promoted_total taskplat_tasks_pruned_total
    taskplat_tasks_replayed_total taskplat_tasks_republished_total taskplat_tasks_retried_total
    taskplat_worker_busy taskplat_worker_calls_rejected_total taskplat_worker_claims_total
    taskplat_worker_tasks_total taskplat_workers_seen
    """.split()
)


def _package_sources() -> dict[str, list[Path]]:
    """The source files of each package (its import name, e.g. `taskplat.dispatcher`)."""
    packages: dict[str, list[Path]] = {}
    for pattern in ("libs/*/src/taskplat/*", "services/*/src/taskplat/*"):
        for package in sorted(ROOT.glob(pattern)):
            if package.is_dir():
                packages[f"taskplat.{package.name}"] = sorted(package.rglob("*.py"))
    return packages


def _instrument_calls(path: Path) -> tuple[set[str], list[str]]:
    """The declarations an instrument call of this module passes (`module.NAME`), and the calls
    that pass something else."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imported: dict[str, str] = {}
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(".metric_specs"):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
            if node.value.attr in METHODS and isinstance(node.targets[0], ast.Name):
                aliases.add(node.targets[0].id)
        if isinstance(node, ast.FunctionDef) and node.name in METHODS:
            aliases.add(node.name)  # a local helper forwarding to Telemetry (the wrapper's)
    used: set[str] = set()
    bad: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in METHODS:
            if isinstance(func.value, ast.Name) and func.value.id == "noop":
                continue  # the OpenTelemetry no-op meter of a wrapper without telemetry
        elif not (isinstance(func, ast.Name) and func.id in aliases):
            continue
        first = node.args[0]
        if isinstance(first, ast.Name) and first.id in imported:
            used.add(imported[first.id])
        elif isinstance(first, ast.Name) and first.id == "spec":
            continue  # the helper's own forwarding call: its callers' calls are read instead
        else:
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    return used, bad


def _catalog_names(module: str) -> set[str]:
    catalog = importlib.import_module(module)
    return {
        f"{module}.{name}"
        for name, value in vars(catalog).items()
        if isinstance(value, Metric) and value in catalog.METRICS
    }


def test_every_instrument_is_created_from_a_declaration_and_every_declaration_is_used() -> None:
    used: set[str] = set()
    bad: list[str] = []
    for files in _package_sources().values():
        for path in files:
            if path.name == "telemetry.py" and path.parent.name == "common":
                continue  # the methods themselves
            found, wrong = _instrument_calls(path)
            used |= found
            bad += wrong
    assert not bad, "instruments not created from a metric_specs declaration:\n" + "\n".join(bad)
    declared = set().union(*(_catalog_names(module) for _, module in CATALOGS))
    assert used == declared, {
        "declared, never created": sorted(declared - used),
        "created, not in a catalog's METRICS": sorted(used - declared),
    }


def test_the_reader_sees_calls_it_must() -> None:
    used, _ = _instrument_calls(ROOT / "services/dispatcher/src/taskplat/dispatcher/recorder.py")
    assert "taskplat.dispatcher.metric_specs.TASKS_CREATED" in used  # `counter = telemetry.counter`
    wrapper = ROOT / "services/worker-wrapper/src/taskplat/worker_wrapper/observability.py"
    used, _ = _instrument_calls(wrapper)
    assert "taskplat.worker_wrapper.metric_specs.SQS_RECEIVED" in used  # a local helper
    assert "taskplat.worker_wrapper.metric_specs.OPERATOR_RUN_TIME" in used


def _one(_options: CallbackOptions) -> list[Observation]:
    return [Observation(1)]


def _exposition(metric: Metric) -> tuple[str, str]:
    """(name, type) the Prometheus exposition gives this declaration in a fresh Telemetry."""
    telemetry = Telemetry("metrics-doc-probe")
    try:
        if metric.kind == "counter":
            telemetry.counter(metric).add(1)
        elif metric.kind == "up_down_counter":
            telemetry.up_down_counter(metric).add(1)
        elif metric.kind == "histogram":
            telemetry.histogram(metric).record(1.0)
        else:
            telemetry.observable_gauge(metric, [_one])
        text = telemetry.prometheus_text().decode()
    finally:
        telemetry.shutdown()
    found = re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE)
    assert len(found) == 1, (metric, text)
    name, kind = found[0]
    return name, kind


def test_each_declaration_predicts_its_exposed_name_and_type() -> None:
    exposed: set[str] = set()
    for _, metrics in declared_metrics():
        for metric in metrics:
            assert _exposition(metric) == (metric.exposed_name, metric.prometheus_type), metric
            assert metric.description, metric
            exposed.add(metric.exposed_name)
    assert exposed == EXPOSED, {
        "new or renamed": sorted(exposed - EXPOSED),
        "gone": sorted(EXPOSED - exposed),
    }

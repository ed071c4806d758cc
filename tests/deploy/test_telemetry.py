"""Every service task ships its metrics and traces, and every scaling policy and alarm on an
application metric reads a metric that really exists.

Checked: each service task (platform and worker pool, upcoming services included) has exactly one
collector sidecar that scrapes the port the service serves /metrics on, under the ECS service's
name, and receives the OTLP traces the service sends; the collector config parses in both export
modes and fits an SSM standard parameter; each application metric a policy or alarm reads is an
instrument in a service's code, declared in its package's metric_specs (so listed in the generated
metrics reference), and published by the collector config with the dimensions the policy or alarm
uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import deploy_model
import pytest
import yaml
from deploy_model import REPO, SPECS, Container

from taskplat.common.metric_spec import declared_metrics

Templates = dict[str, dict[str, Any]]
OTLP_RECEIVER = "127.0.0.1:4318"
# Metrics of services whose code lands separately (deploy_model.UPCOMING): metric -> service dir.
UPCOMING_METRICS = {"taskplat_sink_buffer_messages": "sink"}
# Metrics ports of the upcoming services (their settings classes do not exist yet).
UPCOMING_METRICS_PORTS = {
    "sink": "TASKPLAT_SINK_OPS_PORT",
    "credential-broker": "TASKPLAT_BROKER_PORT",
}


def _service_containers(templates: Templates) -> list[Container]:
    return [
        c
        for c in deploy_model.all_containers(templates)
        if c.name not in {deploy_model.COLLECTOR, "migrate"}
    ]


def _collector_of(container: Container) -> Mapping[str, Any]:
    found = [
        d
        for d in container.properties["ContainerDefinitions"]
        if d["Name"] == deploy_model.COLLECTOR
    ]
    assert len(found) == 1, f"{container.task_definition}: {len(found)} collectors"
    return found[0]


def _env(definition: Mapping[str, Any]) -> dict[str, Any]:
    return {item["Name"]: item["Value"] for item in definition.get("Environment", [])}


def _metrics_port_variable(container: Container) -> str:
    if container.name == "dispatcher":
        return "TASKPLAT_DISPATCHER_PORT"  # the app serves /metrics itself
    if container.name in SPECS:
        variable = SPECS[container.name].health_port_env
        assert variable is not None
        return variable
    return UPCOMING_METRICS_PORTS[container.name]


def _service_name(templates: Templates, container: Container) -> Any:
    for service in deploy_model.resources_of_type(
        templates[container.template], "AWS::ECS::Service"
    ).values():
        if service["Properties"]["TaskDefinition"] == {"Ref": container.task_definition}:
            return service["Properties"]["ServiceName"]
    raise AssertionError(f"no ECS service runs {container.task_definition}")


def test_every_service_task_has_its_collector(cfn_templates: Templates) -> None:
    containers = _service_containers(cfn_templates)
    assert {c.name for c in containers} >= set(SPECS) - {"migrate"}
    for container in containers:
        collector = _collector_of(container)
        env = _env(collector)
        port = container.environment[_metrics_port_variable(container)]
        assert env["COLLECTOR_SCRAPE_TARGET"] == f"127.0.0.1:{port}", container.name
        assert env["COLLECTOR_SERVICE_NAME"] == _service_name(cfn_templates, container)
        assert collector["Essential"] is False, "telemetry must never stop the service"
        secrets = {s["Name"]: s["ValueFrom"] for s in collector["Secrets"]}
        assert set(secrets) == {"AOT_CONFIG_CONTENT"}
        assert "CollectorConfig" in str(secrets["AOT_CONFIG_CONTENT"])
        # Traces go to the collector's receiver, and the collector starts first.
        assert container.environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{OTLP_RECEIVER}"
        assert container.definition["DependsOn"] == [
            {"ContainerName": deploy_model.COLLECTOR, "Condition": "START"}
        ]


def _collector_configs(cfn_templates: Templates) -> dict[str, dict[str, Any]]:
    """Both branches of the CollectorConfig parameter, as the collector would read them."""
    value = cfn_templates["platform.yaml"]["Resources"]["CollectorConfig"]["Properties"]["Value"]
    condition, cloudwatch, otlp = value["Fn::If"]
    assert condition == "ExportsToCloudWatch"
    configs = {}
    for mode, branch in (("cloudwatch", cloudwatch), ("otlp", otlp)):
        text = branch["Fn::Sub"]
        text = re.sub(r"\$\{(?!!)[^}]+\}", "sample-value-of-forty-characters-xxxxxxxx", text)
        text = text.replace("${!", "${")
        assert len(text) < 4096, f"{mode}: {len(text)} characters exceed an SSM standard parameter"
        configs[mode] = yaml.safe_load(text)
    return configs


def test_collector_config_scrapes_and_receives_in_both_modes(cfn_templates: Templates) -> None:
    for mode, config in _collector_configs(cfn_templates).items():
        # Metric names stay as the services expose them (`_total` included).
        assert config["receivers"]["prometheus"]["trim_metric_suffixes"] is False
        scrape = config["receivers"]["prometheus"]["config"]["scrape_configs"]
        assert len(scrape) == 1
        (static,) = scrape[0]["static_configs"]
        assert static["targets"] == ["${env:COLLECTOR_SCRAPE_TARGET}"]
        assert static["labels"]["Service"] == "${env:COLLECTOR_SERVICE_NAME}"
        assert set(static["labels"]) == {"Stack", "Service"}
        assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == OTLP_RECEIVER
        pipelines = config["service"]["pipelines"]
        assert pipelines["metrics"]["receivers"] == ["prometheus"], mode
        assert pipelines["traces"]["receivers"] == ["otlp"], mode
        assert "health_check" in config["service"]["extensions"]  # for /healthcheck
        exporters = {"cloudwatch": (["awsemf"], ["awsxray"]), "otlp": (["otlphttp"],) * 2}
        assert (pipelines["metrics"]["exporters"], pipelines["traces"]["exporters"]) == tuple(
            exporters[mode]
        )


def _walk(value: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        yield value
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _is_application_namespace(namespace: Any) -> bool:
    return namespace == {"Ref": "MetricsNamespace"} or "MetricsNamespace" in str(
        namespace.get("Fn::ImportValue", "") if isinstance(namespace, Mapping) else ""
    )


def _application_metrics(templates: Templates) -> list[tuple[str, str, str, frozenset[str]]]:
    """(template, resource, metric name, dimension names) of every application metric that a
    scaling policy or an alarm reads."""
    found = []
    kinds = {"AWS::CloudWatch::Alarm", "AWS::ApplicationAutoScaling::ScalingPolicy"}
    for template_name, template in templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] not in kinds:
                continue
            for node in _walk(resource["Properties"]):
                if "MetricName" in node and _is_application_namespace(node.get("Namespace")):
                    dimensions = frozenset(d["Name"] for d in node.get("Dimensions", []))
                    found.append((template_name, logical_id, node["MetricName"], dimensions))
    return found


def _instrument_names() -> set[str]:
    """Prometheus base names of every instrument the services and the library create."""
    sources = [*REPO.glob("services/*/src/**/*.py"), *REPO.glob("libs/common/src/**/*.py")]
    names = set()
    for path in sources:
        for match in re.finditer(r"[\"'](taskplat\.[a-z0-9_.]+)[\"']", path.read_text("utf-8")):
            names.add(match.group(1).replace(".", "_"))
    return names


def test_policies_and_alarms_read_metrics_the_services_export(cfn_templates: Templates) -> None:
    used = _application_metrics(cfn_templates)
    assert {name for _, _, name, _ in used} >= {
        "taskplat_outbox_oldest_age_seconds",
        "taskplat_loop_batches_total",
        "taskplat_queue_oldest_age_seconds",
        "taskplat_sqs_send_errors_total",
    }
    instruments = _instrument_names()
    declared = {metric.exposed_name for _, metrics in declared_metrics() for metric in metrics}
    for template_name, logical_id, metric, _ in used:
        upcoming = UPCOMING_METRICS.get(metric)
        if upcoming is not None and not (REPO / "services" / upcoming).is_dir():
            continue
        base = re.sub(r"_(total|seconds)$", "", metric)
        assert base in instruments, f"{template_name} {logical_id}: no service exports {metric}"
        assert metric in declared or base in declared, (
            f"{metric} is declared in no metric_specs module (nor in the metrics reference)"
        )


def test_collector_publishes_every_metric_with_its_dimensions(cfn_templates: Templates) -> None:
    config = _collector_configs(cfn_templates)["cloudwatch"]
    declarations = config["exporters"]["awsemf"]["metric_declarations"]
    published: dict[str, set[frozenset[str]]] = {}
    for declaration in declarations:
        for selector in declaration["metric_name_selectors"]:
            name = selector.removeprefix("^").removesuffix("$")
            for dimensions in declaration["dimensions"]:
                published.setdefault(name, set()).add(frozenset(dimensions))
    for template_name, logical_id, metric, dimensions in _application_metrics(cfn_templates):
        assert dimensions in published.get(metric, set()), (
            f"{template_name} {logical_id} reads {metric} by {sorted(dimensions)}; the collector "
            f"publishes it by {published.get(metric)}"
        )


@pytest.mark.parametrize("template_name", ["worker-pool.yaml"])
def test_worker_pools_use_the_platforms_collector_config(
    template_name: str, cfn_templates: Templates
) -> None:
    template = cfn_templates[template_name]
    platform = cfn_templates["platform.yaml"]
    assert (
        template["Parameters"]["CollectorImage"]["Default"]
        == platform["Parameters"]["CollectorImage"]["Default"]
    )

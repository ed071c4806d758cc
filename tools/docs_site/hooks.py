"""MkDocs hook: the reference pages generated from the code at build time, so they cannot drift.

Generated pages (they exist only in the built site, never in docs/):

- reference/settings.md: every setting of every service, from its pydantic settings class (the
  environment variable, its default, its description).
- reference/http-api.md: every route of the dispatcher, from the OpenAPI document it serves
  (`taskplat.dispatcher.openapi.build_openapi`, the same function behind `GET /openapi.json`); the
  document itself is written beside it as reference/openapi.json.
- reference/metrics.md: every metric of every service, from the declarations its instruments are
  created from (each package's `metric_specs` module, listed in
  `taskplat.common.metric_spec.CATALOGS`): the exposed name, the Prometheus type, the labels and
  the meaning.

The command line's page (docs/reference/cli.md) is rendered by mkdocs-click from the click commands.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from pydantic import AliasChoices, SecretStr
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

SETTINGS_INTRO = """\
Every service reads its settings from the environment once at start-up. Shared by several services:
`DATABASE_URL` (dispatcher and loops only), `SQS_ENDPOINT_URL` (unset: AWS), `AWS_REGION`,
`TASKPLAT_SQS_QUEUE_PREFIX` (`taskplat-`; SQS queue = prefix + task queue),
`TASKPLAT_DEAD_LETTER_QUEUE`, `TASKPLAT_SQS_WIRE_CLIENT` (`true`: the per-task SQS calls skip
boto3's generic machinery; see [Performance](../performance.md)),
`TASKPLAT_WORKER_TOKEN`, `TASKPLAT_LOG_LEVEL`, `TASKPLAT_LOG_FORMAT` (`json` or `console`),
`TASKPLAT_THREAD_SWITCH_INTERVAL_SECONDS` (`0.0005`; how long a thread may keep the GIL while
another waits), `OTEL_EXPORTER_OTLP_ENDPOINT` (traces; unset: off) and
`TASKPLAT_TRACE_SAMPLE_RATIO`. Each service's full list, with defaults:
"""
SERVICES: tuple[tuple[str, str, str], ...] = (
    ("Dispatcher", "taskplat.dispatcher.settings", "DispatcherSettings"),
    ("Outbox relay", "taskplat.outbox_relay.settings", "RelaySettings"),
    ("Scheduler", "taskplat.scheduler.settings", "SchedulerSettings"),
    ("Reaper", "taskplat.reaper.settings", "ReaperSettings"),
    ("Sink", "taskplat.sink.settings", "SinkSettings"),
    ("Worker wrapper", "taskplat.worker_wrapper.settings", "WrapperSettings"),
    ("Credential broker", "taskplat.credential_broker.settings", "BrokerSettings"),
    ("Query service", "taskplat.query_service.settings", "QuerySettings"),
)
METHODS = ("get", "put", "post", "patch", "delete")
METRICS_INTRO = """\
Every service serves its metrics in the Prometheus text format on `GET /metrics` (the loops on
their ops port); see [Operating Taskplat](../operations.md) for the endpoints, the questions the
metrics answer and the alerts worth setting. Counters end in `_total`; durations are histograms
in seconds (`_seconds_bucket`, `_sum`, `_count`). Labels never carry a task id, so cardinality stays
bounded by queues, operators and reasons. A metric is exposed once it has a measurement. A metric
two services export (`taskplat_tasks_failed_total`, ...) is listed under each, with the labels that
service records.
"""


def settings_class(module: str, name: str) -> type[BaseSettings]:
    cls: type[BaseSettings] = getattr(importlib.import_module(module), name)
    return cls


def env_name(cls: type[BaseSettings], field: str) -> str:
    alias = cls.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0]).upper()
    if isinstance(alias, str):
        return alias.upper()
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()


def _default(cls: type[BaseSettings], field: str) -> str:
    info = cls.model_fields[field]
    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    value: Any = info.get_default(call_default_factory=True)
    if info.default_factory is not None and value:
        return "computed at start-up"  # e.g. the worker id, from the host name and pid
    if isinstance(value, SecretStr):
        return "(secret)"
    if value is None:
        return "unset"
    if isinstance(value, list | tuple | dict) and not value:
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_page() -> str:
    lines = [
        "# Settings",
        "",
        "This page is generated from the services' settings classes when the site is built.",
        "",
        SETTINGS_INTRO,
    ]
    for title, module, name in SERVICES:
        cls = settings_class(module, name)
        lines += ["", f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        for field, info in cls.model_fields.items():
            meaning = _cell(info.description or "")
            lines.append(f"| `{env_name(cls, field)}` | {_default(cls, field)} | {meaning} |")
    return "\n".join(lines) + "\n"


def metrics_page() -> str:
    from taskplat.common.metric_spec import declared_metrics

    lines = [
        "# Metrics",
        "",
        "This page is generated from the metrics' declarations in the code when the site is built.",
        "",
        METRICS_INTRO,
    ]
    for title, metrics in declared_metrics():
        lines += [
            "",
            f"## {title}",
            "",
            "| metric | type | labels | meaning |",
            "|---|---|---|---|",
        ]
        for metric in metrics:
            labels = ", ".join(f"`{label}`" for label in metric.labels) or "-"
            meaning = _cell(metric.doc or metric.description)
            lines.append(
                f"| `{metric.exposed_name}` | {metric.prometheus_type} | {labels} | {meaning} |"
            )
    return "\n".join(lines) + "\n"


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[1]
        return f"[`{name}`](#schema-{name.lower()})"
    if "oneOf" in schema or "anyOf" in schema:
        choices: list[dict[str, Any]] = schema.get("oneOf") or schema.get("anyOf") or []
        return " or ".join(_schema_text(each) for each in choices)
    if schema.get("type") == "array":
        return f"array of {_schema_text(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    return f"`{schema.get('type', 'any')}`"


def _limits(schema: dict[str, Any]) -> str:
    """The constraints a field's schema states (default, bounds, lengths), as a short note."""
    notes = [f"default `{json.dumps(schema['default'])}`"] if "default" in schema else []
    for key, word in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("minLength", "length >="),
        ("maxLength", "length <="),
        ("minItems", "items >="),
        ("maxItems", "items <="),
    ):
        for each in [schema, *schema.get("anyOf", [])]:
            if key in each:
                notes.append(f"{word} {each[key]}")
    return f" ({'; '.join(notes)})" if notes else ""


def _operation_lines(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = ["", f"### `{method.upper()} {path}`", "", str(op.get("summary", "")), ""]
    auth = ", ".join(name for each in op.get("security", []) for name in each) or "none"
    lines.append(f"- Authentication: {auth}")
    if "x-taskplat-scope" in op:
        lines.append(f"- Scope: `{op['x-taskplat-scope']}`")
    body = op.get("requestBody")
    if body:
        media = ", ".join(f"`{m}`" for m in body["content"])
        schema = _schema_text(next(iter(body["content"].values())).get("schema", {}))
        required = "required" if body.get("required") else "optional"
        lines.append(f"- Body ({required}, {media}): {schema}")
    params = op.get("parameters", [])
    if params:
        lines += ["", "| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
        for param in params:
            meaning = _cell(str(param.get("description", ""))) + _limits(param.get("schema", {}))
            lines.append(
                f"| `{param['name']}` | {param['in']} | {_schema_text(param.get('schema', {}))} "
                f"| {'yes' if param.get('required') else 'no'} "
                f"| {meaning.strip()} |"
            )
    lines += ["", "| status | meaning | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        content = response.get("content", {})
        body_text = ""
        for media, spec in content.items():
            body_text = _schema_text(spec["schema"]) if spec.get("schema") else f"`{media}`"
        lines.append(f"| {status} | {_cell(str(response.get('description', '')))} | {body_text} |")
    return lines


def http_api_page(document: dict[str, Any]) -> str:
    lines = [
        "# HTTP API",
        "",
        "The dispatcher's routes, generated from the OpenAPI document it serves at",
        "`GET /openapi.json` when the site is built; the same document is",
        "[here](openapi.json). Every error body is an `ErrorResponse` naming the problem.",
        "",
        "## Routes",
    ]
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                lines += _operation_lines(method, path, item[method])
    lines += ["", "## Schemas"]
    for name, schema in document["components"]["schemas"].items():
        lines += ["", f"### `{name}` {{#schema-{name.lower()}}}", ""]
        if schema.get("description"):
            lines += [_cell(str(schema["description"])), ""]
        properties = schema.get("properties", {})
        if not properties:
            lines.append(f"Type: {_schema_text(schema)}")
            continue
        required = set(schema.get("required", []))
        lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
        for field, spec in properties.items():
            lines.append(
                f"| `{field}` | {_schema_text(spec)} | {'yes' if field in required else 'no'} "
                f"| {(_cell(str(spec.get('description', ''))) + _limits(spec)).strip()} |"
            )
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    from taskplat.dispatcher.openapi import build_openapi

    document = build_openapi()
    generated = {
        "reference/settings.md": settings_page(),
        "reference/http-api.md": http_api_page(document),
        "reference/openapi.json": json.dumps(document, indent=2) + "\n",
        "reference/metrics.md": metrics_page(),
    }
    for src_uri, content in generated.items():
        files.append(File.generated(config, src_uri, content=content))
    return files

"""DAG documents: parsing (JSON or YAML) and the rules that need the whole document. Pure functions,
no I/O.

Invariants:
  * a mapping with a key given twice (a job named twice) is refused, in JSON as in YAML: neither
    parser may silently keep the last one;
  * a document over the document limits (depth, nodes: `taskplat.common.documents`) is refused
    (422) before it is built: JSON is checked before it is loaded, YAML is counted node by node as
    it is composed; YAML anchors and aliases are refused (422) where the parser meets the first
    one, so no alias is ever expanded (no "billion laughs");
  * a document is accepted only when every input names a job of the document and one of that job's
    output indexes (or a dataset by name), every schedule is a five-field cron expression, a dataset
    is given one kind within the document, a declared schema belongs to a buffered_postgres output
    and uses only allowed column names and types (one schema per dataset within the document), a
    `postgres` dataset's `postgres_table:` location names its own table (never another dataset's
    or the platform's),
    and the jobs form no cycle (a job reads another's output directly, or through a dataset that
    the other writes); otherwise every problem found is named, each with its location;
  * the document hash is the sha256 of the validated document's canonical JSON, so the same
    document in JSON or YAML, with keys in any order, hashes the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from yaml._yaml import CParser
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from taskplat.common.buffered import Column, SchemaProblem, full_schema
from taskplat.common.contracts import DagDocument
from taskplat.common.contracts.dags import FromDataset, FromJob
from taskplat.common.cron import schedule_error
from taskplat.common.documents import DocumentLimits, DocumentRefused, NodeBudget, check_json
from taskplat.common.errors import MalformedJson, ValidationFailed
from taskplat.dispatcher.requests import validation_detail

POSTGRES_TABLE = "postgres_table:"
OWN_TABLE = re.compile(r"dataset_\{dataset_uuid\}(?:[A-Za-z0-9_]|\{dataset_version\})*")
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})
DEFAULT_LOCATIONS = {
    "postgres": "postgres_table:dataset_{dataset_uuid}",
    "buffered_postgres": "postgres_table:dataset_{dataset_uuid}",
    "s3": "s3://taskplat-datasets/dataset/{dataset_uuid}/version/{dataset_version}/",
    "external": "external:{dataset_uuid}",
}


@dataclass(frozen=True)
class DatasetPlan:
    """A dataset the document writes (with its kind) or only reads (kind None: an existing dataset,
    or a new `external` one)."""

    name: str
    kind: str | None
    location: str | None
    # A buffered_postgres dataset's full column list (org_id, dedupe_key, then the declared ones).
    columns: tuple[Column, ...] | None = None


class _DuplicateKey(Exception):
    pass


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


class _StrictLoader(Composer, CParser, SafeConstructor, Resolver):
    """YAML's safe loader, refusing a mapping key given twice, anchors and aliases, and a document
    over the limits (checked as each node is composed, before anything is built from it). Its
    events come from libyaml's parser (PyYAML's wheels ship it; several times faster than the
    pure-Python one, and linear on deep flow nesting) and its nodes from PyYAML's composer, whose
    `compose_node` this class checks."""

    def __init__(self, stream: str, limits: DocumentLimits) -> None:
        CParser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self.budget = NodeBudget(limits)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise DocumentRefused(
                f"YAML aliases are refused (*{event.anchor} {_where(event)}): write the value "
                "out in full",
                kind="yaml_alias",
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise DocumentRefused(
                f"YAML anchors are refused (&{anchor} {_where(event)}): write the value out "
                "in full",
                kind="yaml_anchor",
            )
        self.budget.add()
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        self.depth += 1
        self.budget.enter(self.depth)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _where(event: yaml.Event | None) -> str:
    mark = event.start_mark if event is not None else None
    return f"at line {mark.line + 1}, column {mark.column + 1}" if mark else "in the document"


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in keys:
            raise _DuplicateKey(str(key))
        keys.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(  # type: ignore[type-var]
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def _load_yaml(text: str, limits: DocumentLimits) -> Any:
    loader = _StrictLoader(text, limits)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_document(
    body: bytes, content_type: str, limits: DocumentLimits | None = None
) -> DagDocument:
    """The document in `body` (YAML when the content type says so, else JSON), within `limits`
    (default: the default limits) and validated against the contract. Raises MalformedJson (400)
    or ValidationFailed (422; DocumentRefused for a document over the limits)."""
    limits = limits or DocumentLimits()
    is_yaml = content_type.split(";")[0].strip().lower() in YAML_TYPES
    if not body.strip():
        raise MalformedJson("request body is empty; a DAG document is required")
    try:
        if is_yaml:
            raw = _load_yaml(body.decode("utf-8"), limits)
        else:
            check_json(body, limits)
            raw = json.loads(body, object_pairs_hook=_pairs_without_duplicates)
    except _DuplicateKey as exc:
        key = exc.args[0]
        raise ValidationFailed(
            f"key {key!r} is given twice (a job or field named twice)",
            detail=[{"loc": ["body"], "msg": f"duplicate key {key!r}", "type": "duplicate"}],
        ) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise MalformedJson(f"request body is not valid YAML: {reason}") from None
    except ValueError as exc:
        kind = "YAML" if is_yaml else "JSON"
        raise MalformedJson(f"request body is not valid {kind}: {exc}") from None
    try:
        return DagDocument.model_validate(raw)
    except ValidationError as exc:
        raise ValidationFailed(
            "DAG document does not match the contract", detail=validation_detail(exc, "body")
        ) from None


def _problem(loc: list[str | int], msg: str, kind: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": kind}


def _reference_problems(doc: DagDocument) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    for name, job in doc.jobs.items():
        if job.schedule is not None and (error := schedule_error(job.schedule)):
            problems.append(_problem(["jobs", name, "schedule"], error, "invalid_cron"))
        for position, edge in enumerate(job.inputs):
            source = edge.from_
            if not isinstance(source, FromJob):
                continue
            loc: list[str | int] = ["jobs", name, "inputs", position, "from"]
            producer = doc.jobs.get(source.job)
            if producer is None:
                problems.append(_problem(loc, f"unknown job {source.job!r}", "unknown_job"))
            elif source.output_index not in {output.index for output in producer.outputs}:
                problems.append(
                    _problem(
                        loc,
                        f"job {source.job!r} has no output index {source.output_index}",
                        "unknown_output",
                    )
                )
    return problems


# Lambda's longest function timeout: a `runtime: lambda` job's `timeout_seconds` is its function's.
LAMBDA_MAX_TIMEOUT_SECONDS = 900


def _runtime_problems(doc: DagDocument) -> list[dict[str, Any]]:
    """A `runtime: lambda` job states its function's timeout (`timeout_seconds`, at most 900): the
    relay leases each invocation for that long plus a grace."""
    problems: list[dict[str, Any]] = []
    for name, job in doc.jobs.items():
        if job.runtime != "lambda":
            continue
        timeout = job.timeout_seconds
        if timeout is None or timeout > LAMBDA_MAX_TIMEOUT_SECONDS:
            problems.append(
                _problem(
                    ["jobs", name, "timeout_seconds"],
                    f"job {name!r} runs on lambda: timeout_seconds (its function's timeout) is "
                    f"required, at most {LAMBDA_MAX_TIMEOUT_SECONDS}",
                    "lambda_timeout",
                )
            )
    return problems


def _dataset_problems(doc: DagDocument) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}
    schemas: dict[str, list[Column]] = {}
    for name, job in doc.jobs.items():
        for position, output in enumerate(job.outputs):
            loc: list[str | int] = ["jobs", name, "outputs", position]
            known = kinds.setdefault(output.dataset, output.kind)
            if known != output.kind:
                problems.append(
                    _problem(
                        loc,
                        f"dataset {output.dataset!r} is given kinds {known!r} and {output.kind!r}",
                        "conflicting_kind",
                    )
                )
            if output.schema_ is not None and output.kind != "buffered_postgres":
                problems.append(
                    _problem(
                        [*loc, "schema"],
                        "a schema is declared only for a buffered_postgres dataset",
                        "unexpected_schema",
                    )
                )
            if output.kind == "buffered_postgres":
                problems += _schema_problems(output, loc, schemas)
            if output.kind == "postgres" and output.location is not None:
                problems += _table_problems(output.location, [*loc, "location"])
    return problems


def _table_problems(location: str, loc: list[str | int]) -> list[dict[str, Any]]:
    """A `postgres` dataset's `postgres_table:` location names its own table only: one whose name
    starts with `dataset_{dataset_uuid}` (then letters, digits, `_` or `{dataset_version}`), so
    it can never be another dataset's table (`dataset_<its uuid>...`) nor a platform table."""
    if not location.startswith(POSTGRES_TABLE):
        return []
    if OWN_TABLE.fullmatch(location.removeprefix(POSTGRES_TABLE)):
        return []
    return [
        _problem(
            loc,
            f"a postgres dataset's location names its own table only: "
            f"'{POSTGRES_TABLE}dataset_{{dataset_uuid}}' optionally followed by letters, digits, "
            f"'_' or '{{dataset_version}}', not {location!r}",
            "foreign_table",
        )
    ]


def _declared(output: Any) -> list[tuple[str, str]]:
    return [(column.name, column.type) for column in output.schema_ or []]


def _schema_problems(
    output: Any, loc: list[str | int], schemas: dict[str, list[Column]]
) -> list[dict[str, Any]]:
    try:
        columns = full_schema(_declared(output))
    except SchemaProblem as exc:
        return [_problem([*loc, "schema", exc.index, exc.field], exc.message, "invalid_column")]
    known = schemas.setdefault(output.dataset, columns)
    if known != columns:
        return [
            _problem(
                [*loc, "schema"],
                f"dataset {output.dataset!r} is given two different schemas",
                "conflicting_schema",
            )
        ]
    return []


def _producers_of(doc: DagDocument) -> dict[str, set[str]]:
    """Dataset name -> the jobs of the document that write it."""
    writers: dict[str, set[str]] = {}
    for name, job in doc.jobs.items():
        for output in job.outputs:
            writers.setdefault(output.dataset, set()).add(name)
    return writers


def upstream_jobs(doc: DagDocument) -> dict[str, list[str]]:
    """Each job -> the jobs whose outputs it reads (directly, or through a dataset they write)."""
    writers = _producers_of(doc)
    graph: dict[str, list[str]] = {}
    for name, job in doc.jobs.items():
        sources: list[str] = []
        for edge in job.inputs:
            source = edge.from_
            if isinstance(source, FromJob):
                if source.job in doc.jobs:
                    sources.append(source.job)
            elif isinstance(source, FromDataset):
                sources.extend(sorted(writers.get(source.dataset, set())))
        graph[name] = list(dict.fromkeys(sources))
    return graph


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A cycle of `graph` as the jobs on it, first job repeated at the end; None if acyclic."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    for root in sorted(graph):
        if color[root] != white:
            continue
        path: list[str] = [root]
        iterators = [iter(graph[root])]
        color[root] = grey
        while iterators:
            nxt = next(iterators[-1], None)
            if nxt is None:
                color[path.pop()] = black
                iterators.pop()
                continue
            if color.get(nxt) == grey:
                return [*path[path.index(nxt) :], nxt]
            if color.get(nxt) == white:
                color[nxt] = grey
                path.append(nxt)
                iterators.append(iter(graph[nxt]))
    return None


def check_document(doc: DagDocument) -> None:
    """Raise ValidationFailed naming every problem of the document (none: it may be applied)."""
    problems = _reference_problems(doc) + _dataset_problems(doc) + _runtime_problems(doc)
    cycle = find_cycle(upstream_jobs(doc))
    if cycle is not None:
        problems.append(_problem(["jobs"], f"the jobs form a cycle: {' -> '.join(cycle)}", "cycle"))
    if problems:
        raise ValidationFailed("; ".join(problem["msg"] for problem in problems), detail=problems)


def dataset_plan(doc: DagDocument) -> list[DatasetPlan]:
    """The datasets the document names, each once: written ones with their kind and location."""
    plans: dict[str, DatasetPlan] = {}
    for job in doc.jobs.values():
        for output in job.outputs:
            buffered = output.kind == "buffered_postgres"
            plans[output.dataset] = DatasetPlan(
                output.dataset,
                output.kind,
                output.location or DEFAULT_LOCATIONS[output.kind],
                tuple(full_schema(_declared(output))) if buffered else None,
            )
    for job in doc.jobs.values():
        for edge in job.inputs:
            if isinstance(edge.from_, FromDataset) and edge.from_.dataset not in plans:
                plans[edge.from_.dataset] = DatasetPlan(edge.from_.dataset, None, None)
    return [plans[name] for name in sorted(plans)]


def document_hash(doc: DagDocument) -> str:
    canonical = json.dumps(
        doc.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

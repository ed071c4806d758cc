"""Limits of the JSON documents (request bodies) the services accept: how deep, how many nodes.
The one home of the rule; the dispatcher's YAML loader counts with the same `NodeBudget`, so a
YAML document obeys exactly the JSON limits. See docs/security.md, "Document limits".

Invariants:
  * a document nests at most `max_depth` containers (a scalar alone is depth 0, `{}` or `[]` is
    1, each container inside another one more) and has at most `max_nodes` nodes (each mapping,
    sequence and scalar counts one, each mapping key one more); over either, it is refused with
    `DocumentRefused` (422, naming the limit) before any contract validates it;
  * `check_json` costs two byte counts for a body that provably fits (no more bytes than
    `max_nodes`, since every node takes at least one byte, and fewer `[`/`{` bytes than
    `max_depth`); any other body is parsed by pydantic's Rust parser (which gives up past
    `PARSER_MAX_DEPTH` levels by itself, so `max_depth` may not exceed it) and walked without
    recursion, stopping at the first limit crossed;
  * malformed JSON is not this module's to name: `check_json` lets it through for the caller's
    parser to refuse (400);
  * `read_body` refuses a body over its size cap (413) from its declared length, or as soon as
    the bytes received pass the cap: a body is never buffered whole before its size is known.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic_core import from_json

from taskplat.common.errors import PayloadTooLarge, ValidationFailed

# pydantic-core's JSON parser refuses documents nested deeper than this on its own.
PARSER_MAX_DEPTH = 200
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_NODES = 100_000


@dataclass(frozen=True)
class DocumentLimits:
    max_depth: int = DEFAULT_MAX_DEPTH
    max_nodes: int = DEFAULT_MAX_NODES


class DocumentRefused(ValidationFailed):
    """A document over a limit, or using a construct that is refused (YAML anchors and aliases).
    `kind` is the stable `type` of its one `detail` entry."""

    code = "document_refused"

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message, detail=[{"loc": ["body"], "msg": message, "type": kind}])
        self.kind = kind


def too_deep(limits: DocumentLimits) -> DocumentRefused:
    return DocumentRefused(
        f"the document nests more than {limits.max_depth} levels deep (the limit)", kind="max_depth"
    )


class NodeBudget:
    """Counts the nodes and checks the depth of one document as it is read."""

    def __init__(self, limits: DocumentLimits) -> None:
        self.limits = limits
        self.nodes = 0

    def add(self, count: int = 1) -> None:
        self.nodes += count
        if self.nodes > self.limits.max_nodes:
            raise DocumentRefused(
                f"the document has more than {self.limits.max_nodes} nodes (values and keys; "
                "the limit)",
                kind="max_nodes",
            )

    def enter(self, depth: int) -> None:
        """A container opened at `depth` (the document's own top container is depth 1)."""
        if depth > self.limits.max_depth:
            raise too_deep(self.limits)


def check_tree(value: Any, limits: DocumentLimits) -> None:
    """Refuse a parsed JSON value (dicts, lists, scalars) over the limits."""
    budget = NodeBudget(limits)
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        budget.add()
        if isinstance(item, dict):
            budget.enter(depth + 1)
            budget.add(len(item))  # the keys
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            budget.enter(depth + 1)
            pending.extend((child, depth + 1) for child in item)


def fits_trivially(body: bytes, limits: DocumentLimits) -> bool:
    """Whether `body` cannot exceed the limits, judged from its bytes alone (C speed)."""
    return len(body) <= limits.max_nodes and body.count(b"[") + body.count(b"{") <= limits.max_depth


def check_json(body: bytes, limits: DocumentLimits) -> None:
    """Refuse a JSON body over the limits (DocumentRefused); malformed JSON passes through."""
    if fits_trivially(body, limits):
        return
    try:
        value = from_json(body)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise too_deep(limits) from None
        return  # malformed: the caller's parser names the problem
    check_tree(value, limits)


class BodySource(Protocol):
    """What `read_body` needs of a request (Starlette's `Request` is one)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


async def read_body(request: BodySource, max_bytes: int) -> bytes:
    """The request's body, refused (PayloadTooLarge) once it is known to exceed `max_bytes`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)

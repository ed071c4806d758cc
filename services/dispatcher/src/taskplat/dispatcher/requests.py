"""Reading requests: size-capped bodies, strict JSON parsing, path and query validation.

Invariants: a body over the cap is refused with 413 before it is buffered whole; a body over the
document limits (`max_document_depth`, `max_document_nodes`: `taskplat.common.documents`) is a 422
before any contract sees it; malformed JSON is a 400 and a contract violation a 422 naming each
offending field; nothing is written before the whole request validated. No body holds the event
loop: one over `INLINE_BODY_BYTES` is checked and validated on one of `PARSE_THREADS` threads
(`off_loop`), while the small bodies of the worker routes stay on the loop, where their checks cost
a few microseconds.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from uuid import UUID

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from taskplat.common.documents import DocumentLimits, check_json
from taskplat.common.documents import read_body as read_body
from taskplat.common.errors import MalformedJson, ValidationFailed
from taskplat.common.settings import DocumentLimitSettings

ModelT = TypeVar("ModelT", bound=BaseModel)
ResultT = TypeVar("ResultT")

# Bodies up to this size are checked and validated on the event loop (well under a millisecond).
INLINE_BODY_BYTES = 16 * 1024
# Threads that parse larger documents: a few at once, so they cannot starve the loop of the GIL.
PARSE_THREADS = 2
_parsers = ThreadPoolExecutor(max_workers=PARSE_THREADS, thread_name_prefix="document-parser")


async def off_loop(work: Callable[..., ResultT], *args: Any) -> ResultT:
    """Run CPU-heavy `work(*args)` (parsing, validating a large document) off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_parsers, work, *args)


def document_limits(request: Request) -> DocumentLimits:
    settings: DocumentLimitSettings = request.app.state.settings
    return settings.document_limits()


def validation_detail(exc: ValidationError, prefix: str) -> list[dict[str, Any]]:
    """Pydantic errors as `{loc, msg, type}`; the offending input is not echoed back."""
    return [
        {"loc": [prefix, *error["loc"]], "msg": error["msg"], "type": error["type"]}
        for error in exc.errors(include_url=False, include_input=False)
    ]


async def parse_body(
    request: Request, model: type[ModelT], max_bytes: int, *, optional: bool = False
) -> ModelT:
    """The body as `model`; an empty body is the model's defaults when `optional`."""
    body = await read_body(request, max_bytes)
    if optional and not body.strip():
        return model()
    limits = document_limits(request)
    if len(body) > INLINE_BODY_BYTES:
        return await off_loop(validate_body, body, model, limits)
    return validate_body(body, model, limits)


def validate_body(body: bytes, model: type[ModelT], limits: DocumentLimits) -> ModelT:
    """`body` as `model`, within the document limits."""
    if not body.strip():
        raise MalformedJson("request body is empty; a JSON object is required")
    check_json(body, limits)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            raise MalformedJson(
                "request body is not valid JSON", detail=validation_detail(exc, "body")
            ) from None
        raise ValidationFailed(
            "request body does not match the contract", detail=validation_detail(exc, "body")
        ) from None


def parse_uuid(value: str, *, name: str, where: str = "path") -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise ValidationFailed(
            f"{name} is not a valid UUID",
            detail=[{"loc": [where, name], "msg": "not a valid UUID", "type": "uuid_parsing"}],
        ) from None


_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def parse_queue_name(value: str) -> str:
    if not _QUEUE_NAME.match(value):
        raise ValidationFailed(
            "queue is not a valid queue name (1-64 of A-Z a-z 0-9 _ -)",
            detail=[{"loc": ["path", "queue"], "msg": "not a queue name", "type": "pattern"}],
        )
    return value


def parse_query(request: Request, model: type[ModelT]) -> ModelT:
    params: dict[str, str] = {}
    for key, value in request.query_params.multi_items():
        if key in params:
            raise ValidationFailed(
                f"query parameter {key} given more than once",
                detail=[{"loc": ["query", key], "msg": "repeated", "type": "repeated"}],
            )
        params[key] = value
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        raise ValidationFailed(
            "query parameters do not match the contract", detail=validation_detail(exc, "query")
        ) from None

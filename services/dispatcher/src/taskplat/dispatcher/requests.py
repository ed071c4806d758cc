"""Reading requests: size-capped bodies, strict JSON parsing, path and query validation.

Invariants: a body over the cap is refused with 413 before it is buffered whole; malformed JSON is a
400 and a contract violation a 422 naming each offending field; nothing is written before the whole
request validated.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar
from uuid import UUID

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from taskplat.common.errors import MalformedJson, PayloadTooLarge, ValidationFailed

ModelT = TypeVar("ModelT", bound=BaseModel)


async def read_body(request: Request, max_bytes: int) -> bytes:
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
    if not body.strip():
        if optional:
            return model()
        raise MalformedJson("request body is empty; a JSON object is required")
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

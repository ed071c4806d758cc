"""The body of `POST /query` and its OpenAPI document.

Invariant: the request model is the one source of both the validation and the document's schema;
unknown fields are refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from taskplat.common.contracts.base import Contract


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("text must not contain NUL (\\u0000) characters")
    return text


# Text without NUL (checked by a validator, not a pattern: the document stays cheap to fuzz).
Text = Annotated[str, AfterValidator(_no_nul)]
Param = Annotated[Text, Field(max_length=65_536)] | int | float | bool | None


class QueryRequest(Contract):
    sql: Annotated[Text, Field(min_length=1, max_length=100_000)]
    params: Annotated[list[Param], Field(max_length=1000)] | None = None
    max_rows: Annotated[int, Field(ge=0, le=10_000_000)] | None = Field(
        None, description="Most rows wanted; capped by the service's own limit."
    )
    format: Literal["json", "csv", "arrow"] = "json"


ERROR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}, "detail": {}},
}


def openapi() -> dict[str, Any]:
    schema = QueryRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}

    def refusal(text: str) -> dict[str, Any]:
        return {"description": text, **error}

    answer = {
        "type": "object",
        "required": ["columns", "rows", "row_count", "truncated", "elapsed_ms"],
        "properties": {
            "columns": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "type"],
                    "properties": {"name": {"type": "string"}, "type": {"type": "string"}},
                },
            },
            "rows": {"type": "array", "items": {"type": "array"}},
            "row_count": {"type": "integer", "minimum": 0},
            "truncated": {"type": "boolean"},
            "elapsed_ms": {"type": "number", "minimum": 0},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Taskplat query service", "version": "1"},
        "components": {
            "schemas": {"QueryRequest": schema, "QueryAnswer": answer, "Error": ERROR, **defs},
            "securitySchemes": {"capability": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"capability": []}],
        "paths": {
            "/query": {
                "post": {
                    "operationId": "query",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/QueryRequest"}
                            }
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "The rows (JSON), or CSV / Arrow IPC bytes",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/QueryAnswer"}
                                },
                                "text/csv": {"schema": {"type": "string"}},
                                "application/vnd.apache.arrow.stream": {
                                    "schema": {"type": "string", "format": "binary"}
                                },
                            },
                        },
                        "400": refusal("The SQL does not parse"),
                        "401": refusal("No valid capability token"),
                        "403": refusal("The statement references something not allowed"),
                        "408": refusal("The query ran past the time limit"),
                        "413": refusal("The body is too large"),
                        "422": refusal("The body is invalid, or the query failed"),
                        "429": refusal("Too many queries of this token"),
                        "502": refusal("STS or an input's storage failed"),
                    },
                }
            }
        },
    }

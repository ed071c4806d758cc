"""The base of every contract model.

Invariants: unknown fields are rejected, never ignored; models are immutable once parsed; every
value a contract accepts can be stored: free JSON holds no NaN/Infinity and no NUL character (JSON
and Postgres `jsonb` cannot hold them), text holds no NUL (Postgres `text` cannot), integers
stored as `bigint` fit in 64 bits.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

_T = TypeVar("_T")

# Text without NUL characters (Postgres text cannot hold them).
NO_NUL = r"^[^\x00]*$"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# An integer stored as a Postgres bigint.
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


def _storable_json(value: _T) -> _T:
    """Refuse what JSON and Postgres `jsonb` cannot hold: NaN, Infinity and NUL characters."""
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("NaN and Infinity are not JSON numbers")
        if isinstance(item, str) and "\x00" in item:
            raise ValueError("text must not contain NUL (\\u0000) characters")
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


# A JSON object / array of arbitrary content (config, inputs, results).
JsonObject = Annotated[dict[str, Any], AfterValidator(_storable_json)]
JsonArray = Annotated[list[Any], AfterValidator(_storable_json)]
# Any JSON value (a step's result).
JsonValue = Annotated[Any, AfterValidator(_storable_json)]

# Bounded free text fields.
ShortText = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]
QueueName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
OperatorName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
WorkerId = Annotated[str, Field(min_length=1, max_length=256, pattern=NO_NUL)]


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

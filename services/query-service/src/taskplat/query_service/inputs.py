"""The views of one capability: which of its pinned inputs exist, under what names, read from where.

Invariants:
  * Only a capability input (a pinned `dataset_uuid`, `dataset_version`) becomes a view, and only
    while the database agrees: `taskplat_query_inputs` (migration 0029) answers for the token's
    attempt only while it is running, and only for the versions its task pins. The service's
    role has no right on the catalog or dataset tables themselves.
  * A token with inputs of which the database grants none (its attempt ended, or its task pins
    none of them) is refused (`AttemptNotRunning`, 403) before any sandbox is taken.
  * A `postgres` or `buffered_postgres` input reads the table of its pinned version; an `s3` input
    reads the Parquet objects under the prefix the token states (the prefix the session policy of
    its S3 credentials allows); an `external` input, or one with no table, has no view.
  * Each view has two names: `dataset_<uuid hex>`, always, and the dataset's name when it is
    unique (case-insensitively) among the inputs and not one of the uuid names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from taskplat.common.errors import Forbidden
from taskplat.common.tokens.capability import S3_SCHEME, Capability

POSTGRES_KINDS = ("postgres", "buffered_postgres")


class AttemptNotRunning(Forbidden):
    code = "attempt_not_running"


@dataclass(frozen=True)
class InputView:
    dataset_uuid: UUID
    dataset_version: UUID
    name: str
    kind: str
    table_name: str | None
    s3_prefix: str | None
    task_id: UUID  # the attempt reading it (the token's), checked again at each read
    attempt: int

    @property
    def uuid_view(self) -> str:
        return f"dataset_{self.dataset_uuid.hex}"


def lookup(pool: ConnectionPool[Any], capability: Capability) -> list[InputView]:
    """The readable inputs of `capability`, in the token's order."""
    pairs = {(i.dataset_uuid, i.dataset_version): i for i in capability.inputs}
    if not pairs:
        return []
    reader = (capability.task_id, capability.attempt)
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT dataset_uuid, dataset_version, name, kind, table_name "
            "FROM taskplat_query_inputs(%s, %s, %s::uuid[], %s::uuid[])",
            (*reader, [str(d) for d, _ in pairs], [str(v) for _, v in pairs]),
        ).fetchall()
    if not rows:
        raise AttemptNotRunning(
            f"attempt {capability.attempt} of task {capability.task_id} is not running, or its "
            "task pins none of the token's inputs: the token reads nothing"
        )
    found = {(row[0], row[1]): row for row in rows}
    views: list[InputView] = []
    for key, granted in pairs.items():
        row = found.get(key)
        if row is None:
            continue
        _, _, name, kind, table = row
        if kind in POSTGRES_KINDS and table:
            views.append(InputView(key[0], key[1], name, kind, table, None, *reader))
        elif kind == "s3" and granted.location.startswith(S3_SCHEME):
            views.append(InputView(key[0], key[1], name, kind, None, granted.location, *reader))
    return views


def view_names(views: list[InputView]) -> dict[str, InputView]:
    """Every name a query may use, lower-cased, to its input."""
    names = {view.uuid_view: view for view in views}
    counts: dict[str, int] = {}
    for view in views:
        counts[view.name.lower()] = counts.get(view.name.lower(), 0) + 1
    for view in views:
        lowered = view.name.lower()
        if counts[lowered] == 1 and lowered not in names:
            names[lowered] = view
    return names

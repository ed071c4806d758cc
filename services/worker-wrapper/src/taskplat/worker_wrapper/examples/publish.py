"""`publish`: the example producer of buffered datasets. Publishes `config.count` records (default
10) to the job's buffered_postgres output `config.output` (default 0), in the organisation
`config.org_id`, with dedupe keys `config.prefix` + `start + i` (so two runs with overlapping ranges
publish duplicates) and the fields of `config.fields` on every record. Returns how many."""

from __future__ import annotations

from typing import Any

from taskplat.worker_wrapper.sdk import Task, publish_records, serve

DEFAULT_ORG = "00000000-0000-4000-8000-000000000000"


def handle(task: Task) -> dict[str, Any]:
    config = task.config
    start, count = int(config.get("start", 0)), int(config.get("count", 10))
    prefix, fields = str(config.get("prefix", "r")), dict(config.get("fields") or {})
    org_id = str(config.get("org_id", DEFAULT_ORG))
    records = (
        {"org_id": org_id, "dedupe_key": f"{prefix}{n}", **fields}
        for n in range(start, start + count)
    )
    return {"published": publish_records(config.get("output", 0), records)}


if __name__ == "__main__":
    raise SystemExit(serve(handle))

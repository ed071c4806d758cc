"""`top-alerts`: an untrusted operator. It holds no database URL and no AWS credential: it reads
the inputs its task pins through the query service, with the capability token the wrapper gave
it (`TASKPLAT_CAPABILITY_TOKEN`), and returns the count of alerts by severity."""

from __future__ import annotations

from typing import Any

from taskplat.lambda_runtime import Task, query, serve

COUNTS = (
    "SELECT severity, count(*) AS alerts FROM tutorial_alerts "
    "GROUP BY severity ORDER BY alerts DESC, severity"
)


def handle(task: Task) -> dict[str, Any]:
    return {"by_severity": query(COUNTS).records()}


if __name__ == "__main__":
    raise SystemExit(serve(handle))

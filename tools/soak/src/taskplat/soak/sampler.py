"""What a soak samples: each service process's RSS, open fds and threads (from /proc), the
Postgres connections per application_name (pg_stat_activity), each table's dead tuples and total
size (pg_stat_user_tables, pg_total_relation_size), and the backlog of Queued tasks.

Invariants:
- Reading never changes anything: /proc files and read-only queries (soak.sql).
- A process that vanished between listing and reading (a restart) is skipped for that sample;
  the soak counts restarts separately (`Stack.exits`).
- Series are keyed by name and created on first sight; `judged` is false for the tables named
  in `data_tables` (a dataset's rows grow with the data by design).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from taskplat.common.db.queries import load_queries
from taskplat.soak.series import Series

QUERIES = load_queries("taskplat.soak", "soak.sql")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_stats(pid: int, proc: Path = Path("/proc")) -> dict[str, float] | None:
    """RSS (bytes), open fds and threads of one process; None when it is gone."""
    try:
        statm = (proc / str(pid) / "statm").read_text().split()
        status = (proc / str(pid) / "status").read_text()
        fds = len(os.listdir(proc / str(pid) / "fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    threads = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), 0
    )
    return {"rss": float(int(statm[1]) * _PAGE), "fds": float(fds), "threads": float(threads)}


class Sampler:
    """Collects one sample of everything at each `sample(t, pids)` call."""

    def __init__(self, database_url: str, data_tables: Iterable[str] = ()) -> None:
        self.database_url = database_url
        self.data_tables = set(data_tables)
        self.series: dict[str, Series] = {}
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _series(self, name: str, kind: str, *, judged: bool = True) -> Series:
        if name not in self.series:
            self.series[name] = Series(name, kind, judged)
        return self.series[name]

    def _query(self, name: str) -> list[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.database_url,
                autocommit=True,
                row_factory=dict_row,
                application_name="taskplat-soak-sampler",
            )
        sql: LiteralString = QUERIES[name]
        return self._conn.execute(sql).fetchall()

    def sample(self, t: float, pids: dict[str, int]) -> None:
        for service, pid in sorted(pids.items()):
            stats = process_stats(pid)
            if stats is None:
                continue
            for kind, value in stats.items():
                self._series(f"{kind} {service}", kind).add(t, value)
        for row in self._query("connections"):
            self._series(f"connections {row['application']}", "connections").add(t, row["n"])
        for row in self._query("tables"):
            judged = row["name"] not in self.data_tables
            self._series(f"dead_tuples {row['name']}", "dead_tuples", judged=judged).add(
                t, row["dead"]
            )
            self._series(f"relation_bytes {row['name']}", "relation_bytes", judged=judged).add(
                t, row["bytes"]
            )
        counts = self._query("task_counts")[0]
        self._series("backlog queued tasks", "backlog").add(t, counts["queued"])

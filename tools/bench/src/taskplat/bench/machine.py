"""The machine a benchmark ran on, recorded beside its figures.

Invariant: every reader degrades to None (or "unknown") instead of failing: a result file is
always written, even where /proc, git or the database cannot tell.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from taskplat.common.db.queries import load_queries

QUERIES = load_queries("taskplat.bench", "bench.sql")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> dict[str, Any]:
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def postgres_server(database_url: str) -> dict[str, Any] | None:
    """Version and durability settings of the bench's Postgres (None when unreachable)."""
    try:
        with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
            return conn.execute(QUERIES["server"]).fetchone()
    except psycopg.Error:
        return None


def fsync_ms(directory: Path, writes: int = 200) -> float | None:
    """Median milliseconds of one 8 kB write + fdatasync in `directory` (a commit's floor)."""
    path = directory / ".fsync-probe"
    block = b"\0" * 8192
    times: list[float] = []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(writes):
                started = time.perf_counter()
                os.pwrite(fd, block, 0)
                os.fdatasync(fd)
                times.append(time.perf_counter() - started)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
    except OSError:
        return None
    return round(statistics.median(times) * 1000, 3)


def describe(database_url: str | None = None, run_dir: Path | None = None) -> dict[str, Any]:
    """Cores, memory, CPU model, OS, Python, Postgres (with its durability settings), the
    disk's fdatasync latency, git."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": _memory_gib(),
        "cpu_model": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "postgres": postgres_server(database_url) if database_url else None,
        "fdatasync_ms": fsync_ms(run_dir) if run_dir is not None else None,
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
        "git": git_commit(),
    }

"""What `taskplat` commands print: one JSON document with `--json`, else tables and messages.

Invariants: with `--json` stdout holds exactly one JSON document (`emit`); human output goes to
stdout as tables, progress and messages to stderr (`ERR`); a followed task that did not end
Completed exits with status 3 (`finish`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

import click
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from taskplat.client.cli_options import cli_settings
from taskplat.client.models import TaskView
from taskplat.client.sync import Client

NOT_COMPLETED_EXIT = 3

OUT = Console(highlight=False, soft_wrap=True)
ERR = Console(stderr=True, highlight=False)


def emit(value: Any, human: Callable[[], None]) -> None:
    if cli_settings().json:
        if isinstance(value, BaseModel):
            click.echo(value.model_dump_json(indent=2, by_alias=True))
        else:
            click.echo(json.dumps(value, indent=2, default=str))
    else:
        human()


def when(value: Any) -> str:
    return "" if value is None else str(value.isoformat(timespec="seconds"))


def tasks_table(tasks: list[TaskView], title: str | None = None) -> None:
    table = Table(title=title, box=None, header_style="bold")
    for column in ("TASK", "STATUS", "ATTEMPT", "QUEUE", "OPERATOR", "CREATED", "LAST ERROR"):
        table.add_column(column, no_wrap=column != "LAST ERROR")
    for task in tasks:
        error = (task.last_error or "").splitlines()[0][:60] if task.last_error else ""
        table.add_row(str(task.task_id), task.status, f"{task.attempt}/{task.max_attempts}",
                      task.queue, task.operator, when(task.created_at), error)  # fmt: skip
    OUT.print(table)


def task_detail(task: TaskView) -> None:
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    job = f"{task.job.dag_name}/{task.job.name}" if task.job else ""
    rows = [("task_id", str(task.task_id)), ("status", task.status),
            ("attempt", f"{task.attempt} of {task.max_attempts}"), ("queue", task.queue),
            ("priority", str(task.priority)), ("concurrency_key", task.concurrency_key or ""),
            ("operator", task.operator), ("job", job), ("created_at", when(task.created_at)),
            ("started_at", when(task.started_at)), ("finished_at", when(task.finished_at)),
            ("next_retry_at", when(task.next_retry_at)), ("worker_id", task.worker_id or ""),
            ("dead_reason", task.dead_reason or ""), ("last_error", task.last_error or ""),
            ("config", json.dumps(task.config)),
            ("result", "" if task.result is None else json.dumps(task.result))]  # fmt: skip
    for key, value in rows:
        if value:
            table.add_row(key, value)
    OUT.print(table)
    if task.attempts:
        attempts = Table(title="attempts", box=None, header_style="bold")
        for column in ("#", "WORKER", "STARTED", "FINISHED", "OUTCOME", "ERROR"):
            attempts.add_column(column)
        for a in task.attempts:
            attempts.add_row(str(a.attempt), a.worker_id, when(a.started_at),
                             when(a.finished_at), a.outcome or "running",
                             (a.error or "").splitlines()[0][:60] if a.error else "")  # fmt: skip
        OUT.print(attempts)


def follow(client: Client, task_id: str | UUID, timeout: float | None) -> TaskView:
    """Poll the task, showing its state on stderr; exit 3 unless it Completed."""
    with ERR.status(f"task {task_id}: waiting") as status:

        def update(task: TaskView) -> None:
            status.update(f"task {task_id}: {task.status} (attempt {task.attempt})")

        task = client.wait(task_id, timeout=timeout, on_update=update)
    return task


def finish(task: TaskView) -> None:
    emit(task, lambda: task_detail(task))
    if task.status != "Completed":
        sys.exit(NOT_COMPLETED_EXIT)


def rows_of(answer: BaseModel, key: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = answer.model_dump(mode="json")[key]
    return rows


def generic_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(box=None, header_style="bold")
    for column in columns:
        table.add_column(column.upper())
    for row in rows:
        table.add_row(*[cell(row.get(column)) for column in columns])
    OUT.print(table)


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return str(len(value))
    return str(value)
